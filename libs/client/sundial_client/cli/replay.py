"""``sundial replay``: replay a window of a pool's Kafka messages into a staging pool, and follow replays.

``sundial replay --pool P --from T1 --to T2 --into staging-P [--handler H] [--job J] [--tenant T] [--rate N]
[--dry-run] [--wait]`` asks for one (``--wait`` shows its progress — scanned / published, rate, ETA — and a
summary, and exits 0 only if it SUCCEEDED); ``sundial replay list``, ``show ID``, ``cancel ID`` and ``runs ID``
read and stop them. Connection, ``--json`` and exit codes as ``sundial jobs`` (:mod:`sundial_client.cli.common`).
"""

from __future__ import annotations

import argparse
import json
import sys
from itertools import islice
from typing import TYPE_CHECKING, Any

from sundial_client.cli import operations
from sundial_client.cli.common import (
    EXIT_CODES,
    OK,
    cell,
    connection_options,
    instant,
    main,
    positive,
    table,
)

if TYPE_CHECKING:
    from sundial_client.client import Client
    from sundial_client.models import Replay

SUBCOMMANDS = ("list", "show", "cancel", "runs")
REPLAY_COLUMNS = ("REPLAY ID", "STATE", "SOURCE", "TARGET", "FROM", "TO", "SCANNED", "MATCHED", "PUBLISHED")


def _row(r: Replay) -> list[Any]:
    return [
        r.replay_id,
        r.state,
        r.source_pool,
        r.target_pool,
        r.window_from,
        r.window_to,
        r.scanned,
        r.matched,
        r.published,
    ]


def _text(r: Replay) -> str:
    wanted = ", ".join(f"{k}={v}" for k, v in r.filter.model_dump(by_alias=True).items() if v) or "everything"
    lines = [
        f"replay {r.replay_id}  {r.state}{'  (dry run)' if r.dry_run else ''}",
        f"  {r.source_pool} [{cell(r.window_from)}, {cell(r.window_to)}) -> {r.target_pool}  filter: {wanted}"
        + (f"  rate: {r.rate_per_sec}/s" if r.rate_per_sec else ""),
        f"  scanned {r.scanned}  matched {r.matched}  published {r.published}"
        + (f"  duplicates {r.duplicates}" if r.duplicates else "")
        + (f"  resumed {r.resumes}x" if r.resumes else ""),
        f"  started {cell(r.started_at)}  finished {cell(r.finished_at)}",
    ]
    if r.error:
        lines.append(f"  error: {r.error}")
    if r.partitions:
        lines.append(
            table(
                ("  PARTITION", "START", "END", "NEXT", "SCANNED", "PUBLISHED"),
                [
                    (f"  {p.partition}", p.start_offset, p.end_offset, p.next_offset, p.scanned, p.published)
                    for p in r.partitions
                ],
            )
        )
    return "\n".join(lines)


def _remaining(r: Replay) -> int | None:
    """Messages left to scan, if every partition's end is known."""
    if any(p.end_offset is None for p in r.partitions) or not r.partitions:
        return None
    return sum(max(0, (p.end_offset or 0) - p.next_offset) for p in r.partitions)


def _progress(r: Replay, last: Replay, dt: float) -> str:
    rate, scan_rate = (r.published - last.published) / dt, (r.scanned - last.scanned) / dt
    left = _remaining(r)
    eta = "?" if left is None or scan_rate <= 0 else f"{left / scan_rate:.0f}s"
    return f"{r.state}  scanned {r.scanned}  published {r.published}  {rate:,.0f} msg/s  ETA {eta}"


def _summary(r: Replay) -> str:
    elapsed = (r.finished_at - r.started_at).total_seconds() if r.finished_at and r.started_at else None
    speed = f" in {elapsed:.1f}s ({r.scanned / elapsed:,.0f} scanned/s)" if elapsed else ""
    return f"{_text(r)}\nsummary: {r.state}: {r.matched} matched, {r.published} published{speed}"


def follow(client: Client, replay: Replay, args: argparse.Namespace) -> int:
    """Show progress until the replay ends; then the summary. Exit 0 only if it SUCCEEDED."""
    watch = client.replays.watch(replay.replay_id, poll_sec=args.interval)
    return operations.follow(replay, watch, args, _progress, _summary)


def replay_create(client: Client, args: argparse.Namespace) -> int:
    replay = client.replays.create(
        source_pool=args.pool,
        window_from=instant(args.window_from, "--from"),
        window_to=instant(args.window_to, "--to"),
        target_pool=args.into,
        handler=args.handler,
        job_id=args.job,
        tenant_id=args.tenant,
        rate_per_sec=args.rate,
        dry_run=args.dry_run,
    )
    if args.wait:
        return follow(client, replay, args)
    return operations.print_brief(replay, replay.replay_id, args)


def replay_list(client: Client, args: argparse.Namespace) -> int:
    return operations.print_list(client.replays.list(page_size=min(args.limit, 200)), args, REPLAY_COLUMNS, _row)


def replay_show(client: Client, args: argparse.Namespace) -> int:
    return operations.show(client.replays.get(args.id), args, lambda r: follow(client, r, args), _text)


def replay_cancel(client: Client, args: argparse.Namespace) -> int:
    replay = client.replays.cancel(args.id)
    return operations.print_brief(replay, replay.replay_id, args, "  (cancel requested)")


def replay_runs(client: Client, args: argparse.Namespace) -> int:
    runs = list(islice(client.replays.runs(args.id), args.limit))
    if args.json:
        print(json.dumps([r.model_dump(mode="json", by_alias=True) for r in runs], indent=2))
        return OK
    rows = [
        (r.original_execution_id, r.handler, r.outcome, f"{r.duration_ms:.1f}", r.deliveries, (r.error or "")[:60])
        for r in runs
    ]
    print(table(("ORIGINAL EXECUTION", "HANDLER", "OUTCOME", "MS", "DELIVERIES", "ERROR"), rows))
    return OK


def replay_parser(argv: list[str]) -> argparse.ArgumentParser:
    common: dict[str, Any] = {"epilog": EXIT_CODES, "formatter_class": argparse.RawDescriptionHelpFormatter}
    if argv and argv[0] in SUBCOMMANDS:
        parser = argparse.ArgumentParser(prog="sundial replay", description="Read and stop replays.", **common)
        add = operations.adder(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"), common)

        add("list", "Replays, newest first.", replay_list).add_argument("--limit", type=positive, default=50)
        show = add("show", "A replay: state, counts, per-partition offsets.", replay_show)
        show.add_argument("id")
        operations.wait_options(show, "Follow it until it ends (exit 0 if it SUCCEEDED).")
        add("cancel", "Cancel a replay (a running one stops at its next batch).", replay_cancel).add_argument("id")
        runs = add("runs", "What the staging workers did with each replayed message.", replay_runs)
        runs.add_argument("id")
        runs.add_argument("--limit", type=positive, default=100)
        return parser
    parser = argparse.ArgumentParser(
        prog="sundial replay",
        description="Replay the messages of a pool's Kafka topic whose broker timestamps lie in [--from, --to) into a "
        "staging pool, where staging workers run them (ctx.replay) without touching production. Also: "
        "`sundial replay list`, `show ID [--wait]`, `cancel ID`, `runs ID`.",
        **common,
    )
    connection_options(parser)
    parser.set_defaults(run=replay_create)
    parser.add_argument("--pool", required=True, help="The source pool.")
    parser.add_argument("--from", dest="window_from", required=True, metavar="INSTANT", help="RFC 3339, inclusive.")
    parser.add_argument("--to", dest="window_to", required=True, metavar="INSTANT", help="RFC 3339, exclusive.")
    parser.add_argument("--into", required=True, metavar="POOL", help="The staging pool (staging-…).")
    parser.add_argument("--handler", help="Only this handler's messages.")
    parser.add_argument("--job", metavar="JOB_ID", help="Only this job's messages.")
    parser.add_argument("--tenant", help="Only this tenant's (a tenant token: always its own).")
    parser.add_argument("--rate", type=positive, metavar="N", help="At most N messages re-published a second.")
    parser.add_argument("--dry-run", action="store_true", help="Count what would be replayed; publish nothing.")
    operations.wait_options(parser, "Show progress until it ends, then a summary.")
    return parser


def replay_main(argv: list[str] | None = None) -> int:
    """Replay a window of a pool's Kafka messages into a staging pool; list, show, cancel replays"""
    args = list(sys.argv[1:] if argv is None else argv)
    return main(lambda: replay_parser(args), args)
