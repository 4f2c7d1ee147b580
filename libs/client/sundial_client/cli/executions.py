"""``sundial executions …``: list, read, follow, cancel and retry executions (one occurrence of a job each).

The list shows each execution's job by name, its handler and pool, and filters by state, job (id or name),
pool, handler and scheduled time; ``get`` and ``watch`` show every attempt's progress and whole error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from datetime import datetime
from itertools import islice
from typing import TYPE_CHECKING

from sundial_client.cli.common import (
    EXECUTION_STATES,
    FAILED,
    NOT_FOUND,
    OK,
    audit_parser,
    dump,
    job_id,
    main,
    optional_instant,
    positive,
    sub,
    table,
    top_parser,
)
from sundial_client.cli.render import (
    AUDIT_COLUMNS,
    EXECUTION_COLUMNS,
    attempt_text,
    audit_row,
    execution_detail_text,
    execution_row,
    execution_text,
    watch_line,
)

if TYPE_CHECKING:
    from sundial_client.client import Client


def job_names(client: Client, ids: Iterable[str]) -> dict[str, str]:
    """The name of each job, fetched together (concurrently, on the client's loop); a job gone shows its id."""
    import asyncio

    from sundial_client.errors import NotFound

    wanted = sorted(set(ids))

    async def name(ident: str) -> str:
        try:
            return (await client.inner.jobs.get(ident)).name
        except NotFound:
            return ident

    async def every() -> list[str]:
        return await asyncio.gather(*(name(i) for i in wanted))

    return dict(zip(wanted, client.bridge.run(every()), strict=True)) if wanted else {}


def list_executions(client: Client, args: argparse.Namespace) -> int:
    page_size = min(args.limit, 200)
    found = client.executions.list(
        args.state,
        job_id=job_id(client, args.job) if args.job is not None else None,
        pool=args.pool,
        handler=args.handler,
        scheduled_from=optional_instant(args.start, "--from"),
        scheduled_to=optional_instant(args.end, "--to"),
        page_size=page_size,
    )
    executions = list(islice(found, args.limit))
    if args.json:
        print(dump(executions))
        return OK
    names = job_names(client, (e.job_id for e in executions))
    print(table(EXECUTION_COLUMNS, (execution_row(e, names) for e in executions)))
    return OK


def get(client: Client, args: argparse.Namespace) -> int:
    execution = client.executions.get(args.id)
    print(dump(execution) if args.json else execution_detail_text(execution))
    return OK


def cancel(client: Client, args: argparse.Namespace) -> int:
    execution = client.executions.cancel(args.id)
    print(dump(execution) if args.json else execution_text(execution))
    return OK


def retry(client: Client, args: argparse.Namespace) -> int:
    execution = client.executions.retry(args.id)
    print(dump(execution) if args.json else execution_text(execution))
    return OK


def trace_link(client: Client, args: argparse.Namespace) -> int:
    execution = client.executions.get(args.id)
    link = execution.trace_link or execution.trace_id
    if link is None:
        print(f"execution {args.id} has no trace", file=sys.stderr)
        return NOT_FOUND
    print(json.dumps({"traceId": execution.trace_id, "traceLink": execution.trace_link}) if args.json else link)
    return OK


def follow(client: Client, execution_id: str, args: argparse.Namespace) -> int:
    """One line per change until the execution ends; then, if it failed, its last attempt's whole error (and
    traceback) on stderr. Exit 0 if it SUCCEEDED, 1 otherwise."""
    last = None
    for last in client.executions.watch(execution_id, poll_sec=args.interval):
        if args.json:
            print(json.dumps(last.model_dump(mode="json", by_alias=True)), flush=True)
        else:
            print(watch_line(last, datetime.now().astimezone()), flush=True)
    assert last is not None
    if last.state != "SUCCEEDED" and last.attempts and last.attempts[-1].error and not args.json:
        print("\n".join(attempt_text(last.attempts[-1])), file=sys.stderr)
    return OK if last.state == "SUCCEEDED" else FAILED


def watch(client: Client, args: argparse.Namespace) -> int:
    return follow(client, args.id, args)


def audit(client: Client, args: argparse.Namespace) -> int:
    trail = client.executions.audit(args.id, actions=args.action or (), page_size=min(args.limit, 200))
    entries = list(islice(trail, args.limit))
    print(dump(entries) if args.json else table(AUDIT_COLUMNS, map(audit_row, entries)))
    return OK


def parser() -> argparse.ArgumentParser:
    top, subparsers = top_parser(
        "sundial executions", "List, read, cancel, retry and follow executions (one occurrence of a job each)."
    )
    listing = sub(
        subparsers,
        "list",
        "Executions, newest first: all, or by state (--state DEAD: the dead letters), job, pool, handler, time.",
        list_executions,
    )
    listing.add_argument("--state", type=str.upper, choices=EXECUTION_STATES)
    listing.add_argument("--job", metavar="JOB", help="Only this job's (its id or its name).")
    listing.add_argument("--pool", help="Only those delivered to this pool.")
    listing.add_argument("--handler", help="Only this handler's.")
    listing.add_argument("--from", dest="start", metavar="INSTANT", help="Scheduled at or after (RFC 3339).")
    listing.add_argument("--to", dest="end", metavar="INSTANT", help="Scheduled before (RFC 3339).")
    listing.add_argument("--limit", type=positive, default=100, help="At most this many (default 100).")
    sub(subparsers, "get", "Show an execution and its attempts (progress, whole error, traceback).", get).add_argument(
        "id"
    )
    sub(subparsers, "cancel", "Cancel an execution (a running one is asked to stop).", cancel).add_argument("id")
    sub(subparsers, "retry", "Give a DEAD execution one more attempt.", retry).add_argument("id")
    sub(subparsers, "trace-link", "Print where the execution's trace is.", trace_link).add_argument("id")
    watching = sub(
        subparsers, "watch", "Follow an execution until it ends; exit 0 if it SUCCEEDED, 1 otherwise.", watch
    )
    watching.add_argument("id")
    watching.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="Poll interval (default 1).")
    audit_parser(subparsers, audit, "an execution", "id")
    return top


def executions_main(argv: list[str] | None = None) -> int:
    """List, read, cancel, retry and follow executions over the API"""
    return main(parser, argv)
