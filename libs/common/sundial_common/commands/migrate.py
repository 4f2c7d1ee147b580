"""``sundial migrate``: bring the schema to the newest revision and register tenants and pools.

``sundial migrate`` (and :func:`sundial_common.stores.schema.upgrade`) bring a database to the newest revision;
running it on a
current database is a no-op, so every deploy can run it first. ``--tenant NAME`` also registers tenants
that are not registered yet, and ``--pool NAME=OWNER`` / ``--staging-pool NAME=OWNER`` pools (``make up``
registers the tenant ``demo`` and its pools ``demo`` and ``staging-demo`` so; afterwards ``sundial tenants`` and
``sundial pools`` manage them).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable

from sundial_common.runtime.settings import CommonSettings, SettingsHelpParser, load_settings
from sundial_common.stores.schema import upgrade


def main(argv: list[str] | None = None) -> int:
    parser = SettingsHelpParser(
        settings=CommonSettings,
        fields=("database_url",),
        prog="sundial migrate",
        description="Apply database migrations (idempotent; safe on every deploy).",
    )
    parser.add_argument("--database-url", default=None, help="Postgres DSN (env SUNDIAL_DATABASE_URL).")
    parser.add_argument("--revision", default="head", help="Target revision (default: head).")
    parser.add_argument(
        "--tenant",
        action="append",
        default=[],
        metavar="NAME",
        help="Register this tenant with the registry's defaults if it is not registered (repeatable).",
    )
    for option, kind in (("--pool", "production"), ("--staging-pool", "staging")):
        parser.add_argument(
            option,
            action="append",
            default=[],
            type=_pool_option(kind),
            metavar="NAME=OWNER",
            help=f"Register this {kind} pool, owned by OWNER (a registered tenant), if it is not registered "
            "(repeatable; its topic is created by its first worker or publish).",
        )
    args = parser.parse_args(argv)
    dsn = args.database_url or load_settings(CommonSettings, parser).database_url
    asyncio.run(upgrade(dsn, args.revision))
    print(f"schema at {args.revision}")
    if args.tenant:
        registered = asyncio.run(_register(dsn, args.tenant))
        print(f"tenants registered: {', '.join(registered) or 'none new'}")
    if args.pool or args.staging_pool:
        created = asyncio.run(_register_pools(dsn, [*args.pool, *args.staging_pool]))
        print(f"pools registered: {', '.join(created) or 'none new'}")
    return 0


def _pool_option(kind: str) -> Callable[[str], tuple[str, str, str]]:
    def parse(text: str) -> tuple[str, str, str]:
        name, sep, owner = text.partition("=")
        if not sep or not name or not owner:
            raise argparse.ArgumentTypeError(f"expected NAME=OWNER, not {text!r}")
        return name, owner, kind

    return parse


async def _register_pools(dsn: str, pools: list[tuple[str, str, str]]) -> list[str]:
    from sundial_common.stores import Stores
    from sundial_common.stores.pools import Pool

    stores = await Stores.connect(dsn, min_size=1, max_size=1)
    try:
        return [
            name
            for name, owner, kind in pools
            if await stores.pools.create_pool(Pool(name=name, owner=owner, kind=kind)) is not None
        ]
    finally:
        await stores.close()


async def _register(dsn: str, names: list[str]) -> list[str]:
    from sundial_common.stores import Stores  # imported late: plain migrations do not need the stores
    from sundial_common.stores.tenants import Tenant

    stores = await Stores.connect(dsn, min_size=1, max_size=1)
    try:
        return [name for name in names if await stores.tenants.create_tenant(Tenant(id=name)) is not None]
    finally:
        await stores.close()
