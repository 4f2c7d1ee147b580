"""``sundial stats …``: the tenant's execution history from the ClickHouse replica (seconds behind Postgres) —
counts, failure rates, lateness and duration percentiles per hour or day, and the slowest and most failing
handlers."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from sundial_client.cli.common import OK, dump, main, optional_instant, positive, sub, table, top_parser

if TYPE_CHECKING:
    from sundial_client.client import Client


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def executions(client: Client, args: argparse.Namespace) -> int:
    stats = client.stats.executions(
        optional_instant(args.start, "--from"),
        optional_instant(args.end, "--to"),
        interval=args.interval,
        group_by=args.group_by,
    )
    if args.json:
        print(dump(stats))
        return OK
    rows = [
        (
            item.start,
            item.group or "",
            item.executions,
            item.failed,
            ratio(item.failure_rate),
            ms(item.lateness_ms.p95),
            ms(item.duration_ms.p50),
            ms(item.duration_ms.p95),
        )
        for item in stats.items
    ]
    headers = ("START", (args.group_by or "").upper(), "EXECUTIONS", "FAILED", "FAILURE", "LATE P95 MS", "DUR P50 MS")
    print(table((*headers, "DUR P95 MS"), rows))
    return OK


def handlers(client: Client, args: argparse.Namespace) -> int:
    ranking = client.stats.handlers(
        optional_instant(args.start, "--from"), optional_instant(args.end, "--to"), limit=args.limit
    )
    if args.json:
        print(dump(ranking))
        return OK
    headers = ("POOL", "HANDLER", "EXECUTIONS", "FAILED", "FAILURE", "DUR P95 MS", "TOP ERROR")
    for title, ranked in (("slowest", ranking.slowest), ("most failing", ranking.most_failing)):
        print(f"{title}:")
        rows = [
            (
                h.pool,
                h.handler,
                h.executions,
                h.failed,
                ratio(h.failure_rate),
                ms(h.duration_ms.p95),
                h.top_error_class or "",
            )
            for h in ranked
        ]
        print(table(headers, rows))
    return OK


def parser() -> argparse.ArgumentParser:
    top, subparsers = top_parser(
        "sundial stats", "The tenant's execution history, from the ClickHouse replica (seconds behind Postgres)."
    )
    by_hour = sub(
        subparsers, "executions", "Counts, failure rate, lateness and duration percentiles per hour or day.", executions
    )
    ranked = sub(subparsers, "handlers", "The slowest and the most failing handlers.", handlers)
    for command in (by_hour, ranked):
        command.add_argument("--from", dest="start", metavar="INSTANT", help="RFC 3339 (default: 24 h / 30 d ago).")
        command.add_argument("--to", dest="end", metavar="INSTANT", help="RFC 3339, exclusive (default: now).")
    by_hour.add_argument("--interval", default="hour", help="`hour` (default) or `day`.")
    by_hour.add_argument("--group-by", help="`state`, `pool` or `handler`.")
    ranked.add_argument("--limit", type=positive, default=10, help="Handlers per list (default 10).")
    return top


def stats_main(argv: list[str] | None = None) -> int:
    """The tenant's execution history (counts, failure rates, percentiles, handlers) over the API"""
    return main(parser, argv)
