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
import sys
import time
from collections.abc import Callable

import asyncpg

from sundial_common.runtime.settings import CommonSettings, SettingsHelpParser, load_settings
from sundial_common.stores.compatibility import check_compatible, known_revisions
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
    parser.add_argument(
        "--wait",
        type=float,
        default=None,
        metavar="SECONDS",
        help="Migrate nothing: wait up to SECONDS until the schema is one this code runs on (at its newest "
        "migration, or newer and compatible), then exit 0; exit 1 if it is not by then. For a process's "
        "init container while a migration Job runs.",
    )
    args = parser.parse_args(argv)
    dsn = args.database_url or load_settings(CommonSettings, parser).database_url
    if args.wait is not None:
        return asyncio.run(_wait(dsn, args.wait))
    asyncio.run(upgrade(dsn, args.revision))
    print(f"schema at {args.revision}")
    if args.tenant:
        registered = asyncio.run(_register(dsn, args.tenant))
        print(f"tenants registered: {', '.join(registered) or 'none new'}")
    if args.pool or args.staging_pool:
        created = asyncio.run(_register_pools(dsn, [*args.pool, *args.staging_pool]))
        print(f"pools registered: {', '.join(created) or 'none new'}")
    return 0


async def _wait(dsn: str, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while True:
        why = await _not_ready(dsn)
        if why is None:
            print("schema ready")
            return 0
        if time.monotonic() >= deadline:
            print(f"schema not ready after {seconds:g} s: {why}", file=sys.stderr)
            return 1
        await asyncio.sleep(1.0)


async def _not_ready(dsn: str) -> str | None:
    """Why this code cannot run on the schema yet (None: it can)."""
    try:
        connection = await asyncpg.connect(dsn, timeout=5)
    except (OSError, asyncpg.PostgresError) as exc:
        return f"database unreachable ({type(exc).__name__}: {exc})"
    try:
        try:
            current = await connection.fetchval("SELECT version_num FROM alembic_version")
        except asyncpg.UndefinedTableError:
            return "not migrated yet"
        newest = max(known_revisions())
        if current in known_revisions() and current < newest:
            return f"at migration {current}, this code needs {newest}"
        await check_compatible(connection)  # newer than this code: fine while it stays compatible
        return None
    finally:
        await connection.close()


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
