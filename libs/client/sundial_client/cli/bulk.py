"""``sundial bulk``: one action on every job or execution a filter selects, run by the server in the background.

``sundial bulk redrive --state DEAD --pool P --since 1h [--dry-run] [--wait]`` re-drives what went DEAD in the last
hour (``--dry-run``: the exact count and the first rows, nothing changed; ``--wait``: a live progress line — done /
total, rate, ETA — and a summary, exit 0 only if it SUCCEEDED). The other actions take the same filter:
``cancel-executions``, and for jobs ``pause``, ``resume``, ``cancel-jobs``, ``trigger``. ``sundial bulk list``,
``show ID [--wait]``, ``items ID [--outcome O]`` and ``abort ID`` read and stop operations. Connection, ``--json`` and
exit codes as ``sundial jobs`` (:mod:`sundial_client.cli.common`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import TYPE_CHECKING, Any

from sundial_client.cli import operations
from sundial_client.cli.common import (
    EXIT_CODES,
    OK,
    cell,
    dump,
    instant,
    main,
    positive,
    table,
)

if TYPE_CHECKING:
    from sundial_client.client import Client
    from sundial_client.models.bulk import BulkOperation

#: Command → (target, action).
ACTIONS = {
    "redrive": ("executions", "redrive"),
    "cancel-executions": ("executions", "cancel"),
    "pause": ("jobs", "pause"),
    "resume": ("jobs", "resume"),
    "cancel-jobs": ("jobs", "cancel"),
    "trigger": ("jobs", "trigger"),
}
SUBCOMMANDS = ("list", "show", "items", "abort")
COLUMNS = ("OPERATION ID", "STATE", "TARGET", "ACTION", "TOTAL", "DONE", "SKIPPED", "FAILED", "CREATED")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``1h``, ``2d``."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"`{text}` is not a duration such as 90s, 15m, 1h or 2d")
    return timedelta(seconds=float(match.group(1)) * _UNIT[match.group(2)])


def _row(o: BulkOperation) -> list[Any]:
    return [o.operation_id, o.state, o.target, o.action, o.total, o.done, o.skipped, o.failed, o.created_at]


def _text(o: BulkOperation) -> str:
    wanted = ", ".join(f"{k}={v}" for k, v in o.filter.model_dump(by_alias=True).items() if v is not None)
    lines = [
        f"bulk operation {o.operation_id}  {o.state}  {o.action} {o.target} of {o.tenant_id}"
        f"  (rate {o.rate_per_sec}/s)",
        f"  filter: {wanted}",
        f"  total {cell(o.total)}  done {o.done}  skipped {o.skipped}  failed {o.failed}"
        + (f"  resumed {o.resumes}x" if o.resumes else ""),
        f"  created {cell(o.created_at)}  started {cell(o.started_at)}  finished {cell(o.finished_at)}",
    ]
    if o.error:
        lines.append(f"  error: {o.error}")
    return "\n".join(lines)


def _progress(o: BulkOperation, last: BulkOperation, dt: float) -> str:
    processed = o.done + o.skipped + o.failed
    rate = (processed - (last.done + last.skipped + last.failed)) / dt
    eta = "?" if o.eta is None else f"{max(0.0, (o.eta - datetime.now(UTC)).total_seconds()):.0f}s"
    return (
        f"{o.state}  {processed}/{cell(o.total)}  done {o.done}  skipped {o.skipped}  failed {o.failed}  "
        f"{rate:,.0f}/s  ETA {eta}"
    )


def _summary(o: BulkOperation) -> str:
    took = (o.finished_at - o.started_at).total_seconds() if o.finished_at and o.started_at else None
    speed = f" in {took:.1f}s" if took else ""
    return f"{_text(o)}\nsummary: {o.state}: {o.done} done, {o.skipped} skipped, {o.failed} failed{speed}"


def follow(client: Client, operation: BulkOperation, args: argparse.Namespace) -> int:
    """A live progress line until the operation ends; then the summary. Exit 0 only if it SUCCEEDED."""
    watch = client.bulk.watch(operation.operation_id, poll_sec=args.interval)
    return operations.follow(operation, watch, args, _progress, _summary)


def _filter(args: argparse.Namespace, target: str) -> dict[str, Any]:
    labels = dict(label.split("=", 1) for label in args.label) if args.label else None
    since = datetime.now(UTC) - args.since if getattr(args, "since", None) is not None else None
    found: dict[str, Any] = {
        "state": args.state or None,
        "pool": args.pool,
        "handler": args.handler,
        "labels": labels,
        "name_prefix": args.name_prefix,
        "priority": args.priority,
        "job_ids": args.job or None,
        "scheduled_from": instant(args.scheduled_from, "--scheduled-from") if args.scheduled_from else None,
        "scheduled_to": instant(args.scheduled_to, "--scheduled-to") if args.scheduled_to else None,
    }
    if target == "executions":
        found["finished_from"] = since  # --since: finished in the last …
    return {k: v for k, v in found.items() if v is not None}


def bulk_create(client: Client, args: argparse.Namespace) -> int:
    target, action = ACTIONS[args.command]
    wanted = _filter(args, target)
    if args.dry_run:
        preview = client.bulk.preview(target, action, tenant_id=args.tenant, **wanted)
        if args.json:
            print(dump(preview))
        else:
            print(f"{preview.count} {target} would be {action}{'d' if action.endswith('e') else 'ed'}; the first:")
            print(
                table(
                    tuple(k.upper() for k in (preview.sample[0] if preview.sample else {"id": 0})),
                    [list(s.values()) for s in preview.sample],
                )
            )
        return OK
    operation = client.bulk.create(target, action, rate_per_sec=args.rate, tenant_id=args.tenant, **wanted)
    if args.wait:
        return follow(client, operation, args)
    return operations.print_brief(operation, operation.operation_id, args)


def bulk_list(client: Client, args: argparse.Namespace) -> int:
    return operations.print_list(client.bulk.list(page_size=min(args.limit, 200)), args, COLUMNS, _row)


def bulk_show(client: Client, args: argparse.Namespace) -> int:
    return operations.show(client.bulk.get(args.id), args, lambda o: follow(client, o, args), _text)


def bulk_items(client: Client, args: argparse.Namespace) -> int:
    items = list(islice(client.bulk.items(args.id, outcome=args.outcome), args.limit))
    if args.json:
        print(json.dumps([i.model_dump(mode="json", by_alias=True) for i in items], indent=2))
        return OK
    print(table(("SEQ", "ID", "OUTCOME", "REASON"), [(i.seq, i.id, i.outcome, i.reason or "") for i in items]))
    return OK


def bulk_abort(client: Client, args: argparse.Namespace) -> int:
    operation = client.bulk.cancel(args.id)
    return operations.print_brief(operation, operation.operation_id, args, "  (cancel requested)")


def _filter_options(p: argparse.ArgumentParser, target: str) -> None:
    f = p.add_argument_group("filter (at least one; every one given must match)")
    f.add_argument("--state", action="append", help="Any of these states (repeat the flag).")
    f.add_argument("--pool")
    f.add_argument("--handler")
    f.add_argument("--label", action="append", metavar="KEY=VALUE", help="A label the job carries (repeatable).")
    f.add_argument("--name-prefix", help="The job's name starts so.")
    f.add_argument("--priority", choices=("HIGH", "NORMAL", "LOW"))
    f.add_argument("--job", action="append", metavar="JOB_ID", help="Only this job (repeatable).")
    f.add_argument("--scheduled-from", metavar="INSTANT", help="Scheduled at or after (RFC 3339).")
    f.add_argument("--scheduled-to", metavar="INSTANT", help="Scheduled before (RFC 3339).")
    if target == "executions":
        f.add_argument("--since", type=duration, metavar="DURATION", help="Finished within this long (e.g. 1h).")
    p.add_argument("--tenant", help="Whose rows (an admin token only: one tenant).")
    p.add_argument("--rate", type=positive, metavar="N", help="At most N rows a second (default 500).")
    p.add_argument("--dry-run", action="store_true", help="Print the exact count and the first rows; change nothing.")
    operations.wait_options(p, "Show a live progress line until it ends, then a summary.")


def bulk_parser(argv: list[str]) -> argparse.ArgumentParser:
    common: dict[str, Any] = {"epilog": EXIT_CODES, "formatter_class": argparse.RawDescriptionHelpFormatter}
    parser = argparse.ArgumentParser(
        prog="sundial bulk",
        description="Act on every job or execution a filter selects, in the background at a bounded rate, with a "
        "dry run, progress and each row's outcome. The selection is fixed when asked: rows created later are never "
        "touched.",
        **common,
    )
    add = operations.adder(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"), common)

    helps = {
        "redrive": "Give DEAD executions (and FAILED ones a retry breaker holds) a new attempt, through the breaker.",
        "cancel-executions": "Cancel PENDING, RUNNING and retry-waiting executions.",
        "pause": "Pause ACTIVE jobs.",
        "resume": "Resume PAUSED jobs.",
        "cancel-jobs": "Cancel jobs, as DELETE /v1/jobs/{id} (a job that DEPENDENT jobs wait on is skipped).",
        "trigger": "Run each job once now.",
    }
    for name, (target, _action) in ACTIONS.items():
        _filter_options(add(name, helps[name], bulk_create), target)
    add("list", "Bulk operations, newest first.", bulk_list).add_argument("--limit", type=positive, default=50)
    show = add("show", "An operation: state, counts, ETA.", bulk_show)
    show.add_argument("id")
    operations.wait_options(show, "Follow it until it ends (exit 0 if it SUCCEEDED).")
    items = add("items", "Each selected row's outcome and why, in the order acted on.", bulk_items)
    items.add_argument("id")
    items.add_argument("--outcome", choices=("DONE", "SKIPPED", "FAILED"))
    items.add_argument("--limit", type=positive, default=100)
    add("abort", "Cancel an operation (a running one stops before its next batch).", bulk_abort).add_argument("id")
    return parser


def bulk_main(argv: list[str] | None = None) -> int:
    """Act on every job or execution a filter selects: re-drive, cancel, pause, resume, trigger"""
    args = list(sys.argv[1:] if argv is None else argv)
    return main(lambda: bulk_parser(args), args)
