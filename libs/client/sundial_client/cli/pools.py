"""``sundial pools``: the pool registry — operators' ``create|list|show|update|delete`` (an admin token), ``mine``
(any tenant's token: the pools it may send work into), ``token create|list|revoke``: the pool tokens of workers
behind the worker gateway (an admin, or the pool's owning tenant), and ``target set|show``: where an HTTP pool's
executions are POSTed (the pool's owner).

A pool is owned (``--owner T``) or shared (``--shared-with A,B``); ``--kind staging`` makes it a replay target.
Connection, ``--json`` and exit codes as for ``sundial jobs`` (:mod:`sundial_client.cli.common`).
"""

from __future__ import annotations

import argparse
import sys
from itertools import islice
from typing import TYPE_CHECKING, Any

from sundial_client.cli.common import OK, dump, main, positive, sub, table, top_parser
from sundial_client.cli.render import pool_detail_text

if TYPE_CHECKING:
    from sundial_client.client import Client
    from sundial_client.models import Pool

COLUMNS = ("NAME", "KIND", "OWNER", "SHARED WITH", "PARTITIONS", "RETENTION MS", "TIMEOUT", "VERSION")


def _row(p: Pool) -> list[Any]:
    return [
        p.name,
        p.kind,
        p.owner,
        ",".join(p.shared_with) or None,
        p.partitions,
        p.retention_ms,
        p.default_timeout_sec,
        p.version,
    ]


def _print(args: argparse.Namespace, pool: Pool) -> None:
    print(dump(pool) if args.json else table(COLUMNS, [_row(pool)]))


def _tenants(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise argparse.ArgumentTypeError("name at least one tenant")
    return names


def _fields(args: argparse.Namespace, *, creating: bool) -> dict[str, Any]:
    """The options given, as the API's fields."""
    names = ["owner", "shared_with", "kind", "delivery", "default_timeout_sec"]
    if creating:
        names += ["partitions", "retention_ms"]
    fields = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    if args.max_attempts is not None:
        fields["default_retry_policy"] = {"maxAttempts": args.max_attempts}
    return fields


def create(client: Client, args: argparse.Namespace) -> int:
    _print(args, client.admin.create_pool(args.name, **_fields(args, creating=True)))
    return OK


def list_pools(client: Client, args: argparse.Namespace) -> int:
    pools = list(islice(client.admin.pools(page_size=min(args.limit, 500)), args.limit))
    print(dump(pools) if args.json else table(COLUMNS, map(_row, pools)))
    return OK


def mine(client: Client, args: argparse.Namespace) -> int:
    pools = list(islice(client.pools.usable(page_size=min(args.limit, 500)), args.limit))
    print(dump(pools) if args.json else table(COLUMNS, map(_row, pools)))
    return OK


def workers(client: Client, args: argparse.Namespace) -> int:
    pool = client.pools.show(args.name)
    print(dump(pool) if args.json else pool_detail_text(pool))
    return OK


def show(client: Client, args: argparse.Namespace) -> int:
    _print(args, client.admin.pool(args.name))
    return OK


def update(client: Client, args: argparse.Namespace) -> int:
    _print(args, client.admin.update_pool(args.name, **_fields(args, creating=False)))
    return OK


def delete(client: Client, args: argparse.Namespace) -> int:
    client.admin.delete_pool(args.name)
    if not args.json:
        print(f"pool {args.name} deleted")
    return OK


TOKEN_COLUMNS = ("ID", "TENANT", "SUBJECT", "TTL SEC", "CREATED BY", "CREATED AT", "REVOKED AT")


def token_create(client: Client, args: argparse.Namespace) -> int:
    issued = client.pools.create_token(args.name, tenant=args.tenant, subject=args.subject, ttl_sec=args.ttl)
    if args.json:
        print(dump(issued))
        return OK
    # The token alone on stdout, so that `export SUNDIAL_WORKER_TOKEN=$(sundial pools token create P)` works.
    print(issued.token)
    expires = issued.expires_at.strftime("%Y-%m-%d %H:%M:%SZ")
    print(
        f"pool token {issued.id}: pool {issued.pool}, tenant {issued.tenant}, expires {expires} unless refreshed",
        file=sys.stderr,
    )
    return OK


def token_list(client: Client, args: argparse.Namespace) -> int:
    tokens = client.pools.tokens(args.name, limit=min(args.limit, 500))
    rows = [[t.id, t.tenant, t.subject, t.ttl_sec, t.created_by, t.created_at, t.revoked_at] for t in tokens]
    print(dump(tokens) if args.json else table(TOKEN_COLUMNS, rows))
    return OK


def token_revoke(client: Client, args: argparse.Namespace) -> int:
    client.pools.revoke_token(args.name, args.id)
    if not args.json:
        print(f"pool token {args.id} revoked")
    return OK


def _token_parser(subparsers: Any) -> None:
    help = "Pool tokens: the credential of workers behind the worker gateway (an admin, or the pool's owner)."
    group = subparsers.add_parser("token", help=help, description=help)
    tokens = group.add_subparsers(dest="token_command", required=True, metavar="COMMAND")
    create_parser = sub(
        tokens, "create", "Mint a pool token; prints the JWT (shown this once).", token_create, admin=True
    )
    create_parser.add_argument("name", help="The pool.")
    create_parser.add_argument(
        "--ttl", type=positive, metavar="SECONDS", help="Lifetime of the token and of each refresh (default 3600)."
    )
    create_parser.add_argument(
        "--tenant", metavar="TENANT", help="Whose work it takes: required for a shared pool (default: the owner)."
    )
    create_parser.add_argument("--subject", help="Who holds it, for logs (default <pool>-worker).")
    list_parser = sub(tokens, "list", "List a pool's tokens, newest first.", token_list, admin=True)
    list_parser.add_argument("name", help="The pool.")
    list_parser.add_argument("--limit", type=positive, default=100, help="At most this many (default 100).")
    revoke_parser = sub(
        tokens, "revoke", "Revoke a pool token: the gateway refuses it within seconds.", token_revoke, admin=True
    )
    revoke_parser.add_argument("name", help="The pool.")
    revoke_parser.add_argument("id", help="The token's id (as `create` and `list` show it).")


def _path(text: str) -> tuple[str, str]:
    handler, sep, path = text.partition("=")
    if not sep or not handler.strip() or not path.strip():
        raise argparse.ArgumentTypeError(f"expected HANDLER=PATH, e.g. send_welcome=welcome; got {text!r}")
    return handler.strip(), path.strip()


def target_set(client: Client, args: argparse.Namespace) -> int:
    paths = dict(args.path) if args.path else None
    target = client.pools.set_target(args.name, args.url, paths=paths, rotate_secret=args.rotate_secret)
    if args.json:
        print(dump(target))
        return OK
    print(f"pool {target.pool}: executions are POSTed to {target.url}", file=sys.stderr)
    if not target.secret.startswith("whsec_…"):
        # The secret alone on stdout (shown this once), so that it can be captured into the target's own config.
        print(target.secret)
    return OK


def target_show(client: Client, args: argparse.Namespace) -> int:
    target = client.pools.target(args.name)
    rows = [[target.pool, target.url, ",".join(f"{h}={p}" for h, p in target.paths.items()) or None, target.secret]]
    print(dump(target) if args.json else table(("POOL", "URL", "PATHS", "SECRET"), rows))
    return OK


def _target_parser(subparsers: Any) -> None:
    help = "An HTTP pool's target: where Sundial POSTs its executions (the pool's owner)."
    group = subparsers.add_parser("target", help=help, description=help)
    targets = group.add_subparsers(dest="target_command", required=True, metavar="COMMAND")
    set_parser = sub(
        targets,
        "set",
        "Set the target's URL and handler paths; prints the signing secret when one is made (the first time, or "
        "with --rotate-secret).",
        target_set,
    )
    set_parser.add_argument("name", help="The pool (its delivery must be http).")
    # Positional: --url is every command's API address (the connection options).
    set_parser.add_argument("url", metavar="URL", help="The target's base URL (https:// outside development).")
    set_parser.add_argument(
        "--path",
        type=_path,
        action="append",
        metavar="HANDLER=PATH",
        help="POST this handler's executions to PATH under the URL (repeatable).",
    )
    set_parser.add_argument("--rotate-secret", action="store_true", help="Make a new signing secret.")
    sub(targets, "show", "Show the target (its secret redacted).", target_show).add_argument("name", help="The pool.")


def _registry_options(parser: argparse.ArgumentParser, *, creating: bool) -> None:
    parser.add_argument("name", help="The pool's name (its topic is sundial.pool.<name>).")
    who = parser.add_mutually_exclusive_group(required=creating)
    who.add_argument("--owner", metavar="TENANT", help="The tenant the pool belongs to.")
    who.add_argument(
        "--shared-with", type=_tenants, metavar="A,B", help="A shared pool: the tenants allowed to use it."
    )
    parser.add_argument(
        "--kind", choices=("production", "staging"), help="`staging`: fed only by replays (default production)."
    )
    parser.add_argument(
        "--delivery",
        choices=("worker", "http"),
        help="`http`: Sundial's delivery workers POST its executions to the target its owner sets (`sundial pools "
        "target set`); default worker.",
    )
    parser.add_argument("--default-timeout-sec", type=positive, metavar="SECONDS", help="Jobs' default timeoutSec.")
    parser.add_argument(
        "--max-attempts", type=positive, metavar="N", help="Jobs' default retry policy: this many attempts."
    )
    if creating:
        parser.add_argument("--partitions", type=positive, help="Partitions of its topic (default 4).")
        parser.add_argument(
            "--retention-ms", type=positive, metavar="MS", help="Its topic's retention (how far a replay reaches)."
        )


def parser() -> argparse.ArgumentParser:
    top, subparsers = top_parser(
        "sundial pools",
        "Register pools: who may send work into each (an owner or shared tenants), its kind (production "
        "or staging) and its jobs' defaults (an admin token; `mine` takes any tenant's token).",
    )
    _registry_options(
        sub(subparsers, "create", "Register a pool and create its topic.", create, admin=True), creating=True
    )
    listing = sub(subparsers, "list", "List every registered pool, in name order.", list_pools, admin=True)
    listing.add_argument("--limit", type=positive, default=100, help="At most this many (default 100).")
    mine_parser = sub(subparsers, "mine", "List the pools your tenant may send work into.", mine)
    mine_parser.add_argument("--limit", type=positive, default=100, help="At most this many (default 100).")
    sub(subparsers, "show", "Show a pool's registry entry.", show, admin=True).add_argument("name")
    sub(
        subparsers,
        "workers",
        "Show who serves one of your pools now: live workers, their handlers and free slots, your backlog.",
        workers,
    ).add_argument("name")
    _registry_options(
        sub(
            subparsers,
            "update",
            "Change who may use a pool, its kind or its defaults (the rest is kept).",
            update,
            admin=True,
        ),
        creating=False,
    )
    _token_parser(subparsers)
    _target_parser(subparsers)
    sub(
        subparsers, "delete", "Delete a pool no active job targets (409 names how many do).", delete, admin=True
    ).add_argument("name")
    return top


def pools_main(argv: list[str] | None = None) -> int:
    """Register pools: owner or shared tenants, kind, job defaults (admin)"""
    return main(parser, argv)
