"""``sundial breakers``: the tenant's retry circuit breakers — ``list`` (state, failure ratio, held retries,
next probe), ``show``, and an operator's ``open`` / ``close``.

Connection, ``--json`` and exit codes as for ``sundial jobs`` (:mod:`sundial_client.cli.common`).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from sundial_client.cli.common import OK, dump, main, sub, table, top_parser

if TYPE_CHECKING:
    from sundial_client.client import Client
    from sundial_client.models import Breaker

COLUMNS = ("ID", "POOL", "HANDLER", "STATE", "FAILED", "HELD", "OPENED AT", "NEXT PROBE", "OPENS")


def _row(b: Breaker) -> list[Any]:
    ratio = f"{b.failures}/{b.attempts}" if b.attempts else None
    return [b.id, b.pool, b.handler, b.state, ratio, b.held, b.opened_at, b.next_probe_at, b.opens]


def _print(args: argparse.Namespace, breaker: Breaker) -> None:
    print(dump(breaker) if args.json else table(COLUMNS, [_row(breaker)]))


def list_breakers(client: Client, args: argparse.Namespace) -> int:
    breakers = client.breakers.list(pool=args.pool, state=args.state)
    print(dump(breakers) if args.json else table(COLUMNS, map(_row, breakers)))
    return OK


def show(client: Client, args: argparse.Namespace) -> int:
    _print(args, client.breakers.get(args.id))
    return OK


def open_breaker(client: Client, args: argparse.Namespace) -> int:
    _print(args, client.breakers.open(args.id))
    return OK


def close_breaker(client: Client, args: argparse.Namespace) -> int:
    _print(args, client.breakers.close(args.id))
    return OK


def parser() -> argparse.ArgumentParser:
    top, subparsers = top_parser(
        "sundial breakers",
        "The tenant's retry circuit breakers, one per (pool, handler): while one is OPEN its handler's "
        "retries are held (not attempted, not counted); `open` holds them by hand until `close`.",
    )
    listing = sub(
        subparsers, "list", "List the breakers (FAILED: failed/finished attempts in the window).", list_breakers
    )
    listing.add_argument("--pool", help="Only this pool's.")
    listing.add_argument("--state", choices=("CLOSED", "OPEN", "HALF_OPEN"), help="Only breakers in this state.")
    sub(subparsers, "show", "Show a breaker.", show).add_argument("id")
    sub(subparsers, "open", "Open a breaker: hold its handler's retries until `close`.", open_breaker).add_argument(
        "id"
    )
    sub(
        subparsers,
        "close",
        "Close a breaker: release its held retries (spread), start its window again.",
        close_breaker,
    ).add_argument("id")
    return top


def breakers_main(argv: list[str] | None = None) -> int:
    """The tenant's retry circuit breakers: list, show, open, close"""
    return main(parser, argv)
