"""``sundial jobs …``: register, list, read, change, pause, resume, trigger, preview, backfill and cancel jobs.

A job is named by its id, its key (``sundial jobs create --key reports/nightly …``, unique per tenant) or its
name (``sundial jobs get nightly-report``): a name is a label for people, so a name that several jobs share is
refused with their ids. Human text by default, ``--json`` for scripts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from itertools import islice
from typing import TYPE_CHECKING, Any

from sundial_client.cli.common import (
    BACKOFFS,
    CATCHUP_POLICIES,
    CONFLICT,
    FAILED,
    JOB_STATES,
    JOB_TYPES,
    OK,
    OVERLAP_POLICIES,
    PRIORITIES,
    audit_parser,
    cell,
    dump,
    instant,
    job_id,
    main,
    positive,
    sub,
    table,
    top_parser,
)
from sundial_client.cli.connection import UsageError
from sundial_client.cli.executions import follow
from sundial_client.cli.render import (
    AUDIT_COLUMNS,
    EXECUTION_COLUMNS,
    JOB_COLUMNS,
    audit_row,
    backfill_text,
    execution_row,
    job_row,
    job_text,
    local_and_utc,
)

if TYPE_CHECKING:
    from sundial_client.client import Client
    from sundial_client.models import Backfill, Job, NewJob


def payload(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--payload is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError("--payload must be a JSON object, e.g. '{\"userId\": 42}'")
    return value


def retry_policy(args: argparse.Namespace) -> dict[str, Any] | None:
    given = {
        "maxAttempts": args.max_attempts,
        "backoff": args.backoff,
        "initialDelayMs": args.initial_delay_ms,
        "maxDelayMs": args.max_delay_ms,
        "jitter": args.retry_jitter,
    }
    policy = {k: v for k, v in given.items() if v is not None}
    return policy or None


def new_job(client: Client, args: argparse.Namespace) -> NewJob:
    from sundial_client.models import JobType, NewJob, Target

    when = [flag for flag in ("delay", "at", "cron", "every", "after") if getattr(args, flag)]
    if len(when) != 1:
        raise UsageError(
            "say when with exactly one of --delay SECONDS, --at INSTANT (repeat it for a run list), --cron EXPR, "
            "--every SECONDS, --after JOB[:SUCCEEDED|FAILED|ANY]"
        )
    fields: dict[str, Any] = {
        "name": args.name,
        "key": args.key,
        "target": Target(pool=args.pool, handler=args.handler),
        "payload": payload(args.payload),
        "timezone": args.tz,
        "start_at": instant(args.start_at, "--start-at") if args.start_at else None,
        "end_at": instant(args.end_at, "--end-at") if args.end_at else None,
        "max_runs": args.max_runs,
        "jitter_sec": args.jitter,
        "timeout_sec": args.timeout,
        "overlap_policy": args.overlap,
        "catchup_policy": args.catchup,
        "priority": args.priority,
        "retry_policy": retry_policy(args),
    }
    if args.delay is not None:
        fields.update(type=JobType.DELAYED, delay_seconds=args.delay)
    elif args.at and len(args.at) == 1:
        fields.update(type=JobType.ONE_SHOT, run_at=instant(args.at[0], "--at"))
    elif args.at:
        fields.update(type=JobType.RUN_LIST, run_list=[instant(a, "--at") for a in args.at])
    elif args.cron is not None:
        fields.update(type=JobType.CRON, schedule=args.cron)
    elif args.every is not None:
        fields.update(type=JobType.INTERVAL, interval_sec=args.every)
    else:
        parents = []
        for parent in args.after:
            ref, sep, on = parent.rpartition(":")
            if not sep or on.upper() not in ("SUCCEEDED", "FAILED", "ANY"):
                ref, on = parent, ""
            parents.append({"job_id": job_id(client, ref), **({"on": on.upper()} if on else {})})
        fields.update(type=JobType.DEPENDENT, depends_on=parents)
    return NewJob.model_validate(fields)


def print_job(args: argparse.Namespace, job: Job) -> None:
    print(dump(job) if args.json else job_text(job))


def create(client: Client, args: argparse.Namespace) -> int:
    print_job(args, client.jobs.create(new_job(client, args)))
    return OK


def list_jobs(client: Client, args: argparse.Namespace) -> int:
    found = client.jobs.list(
        state=args.state,
        type=args.type,
        pool=args.pool,
        handler=args.handler,
        name_prefix=args.name_prefix,
        key=args.key,
        page_size=min(args.limit, 200),
    )
    jobs = list(islice(found, args.limit))
    print(dump(jobs) if args.json else table(JOB_COLUMNS, map(job_row, jobs)))
    return OK


def get(client: Client, args: argparse.Namespace) -> int:
    job = client.jobs.get(job_id(client, args.id))
    if args.json:
        print(dump(job))
        return OK
    print(job_text(job))
    for title, relatives in (("runs after", job.parents), ("runs before", job.children)):
        for r in relatives:
            waiting = f", {r.waiting} waiting" if r.waiting else ""
            print(f"{title}: {r.job_id} {r.name} ({r.state}, on {r.on}{waiting})")
    if job.latest_executions:
        print("\nlatest executions:")
        names = {job.job_id: job.name}
        print(table(EXECUTION_COLUMNS, (execution_row(e, names) for e in job.latest_executions)))
    return OK


def update(client: Client, args: argparse.Namespace) -> int:
    from sundial_client.models import JobType

    changes: dict[str, Any] = {}
    if args.name is not None:
        changes["name"] = args.name
    if args.payload is not None:
        changes["payload"] = payload(args.payload)
    if args.cron is not None:
        changes.update(type=JobType.CRON, schedule=args.cron)
    if args.every is not None:
        changes.update(type=JobType.INTERVAL, interval_sec=args.every)
    if args.tz is not None:
        changes["timezone"] = args.tz
    if args.end_at is not None:
        changes["end_at"] = instant(args.end_at, "--end-at")
    if args.max_runs is not None:
        changes["max_runs"] = args.max_runs
    if args.timeout is not None:
        changes["timeout_sec"] = args.timeout
    if args.jitter is not None:
        changes["jitter_sec"] = args.jitter
    if not changes:
        raise UsageError("nothing to change: give at least one of --name, --payload, --cron, --every, --tz, …")
    print_job(args, client.jobs.update(job_id(client, args.id), if_match=args.if_match, **changes))
    return OK


def delete(client: Client, args: argparse.Namespace) -> int:
    print_job(args, client.jobs.delete(job_id(client, args.id), cascade=args.cascade))
    return OK


def pause(client: Client, args: argparse.Namespace) -> int:
    print_job(args, client.jobs.pause(job_id(client, args.id)))
    return OK


def resume(client: Client, args: argparse.Namespace) -> int:
    print_job(args, client.jobs.resume(job_id(client, args.id)))
    return OK


def print_backfill(args: argparse.Namespace, backfill: Backfill) -> None:
    print(dump(backfill) if args.json else backfill_text(backfill))


def follow_backfill(client: Client, backfill: Backfill, args: argparse.Namespace) -> int:
    """Progress until the backfill has stopped creating executions and those it created have ended."""
    tty = sys.stdout.isatty() and not args.json
    last = None
    while True:
        line = backfill_text(backfill)
        if args.json:
            print(json.dumps(backfill.model_dump(mode="json", by_alias=True)), flush=True)
        elif line != last:
            print(("\r" if tty else "") + line, end="" if tty else "\n", flush=True)
        last = line
        if backfill.state != "RUNNING" and backfill.finished >= backfill.created:
            break
        time.sleep(args.interval)
        backfill = client.jobs.get_backfill(backfill.backfill_id)
    if tty:
        print()
    return OK if backfill.state == "DONE" else FAILED


def backfill(client: Client, args: argparse.Namespace) -> int:
    ident = job_id(client, args.id)
    start, end = instant(args.start, "--from"), instant(args.end, "--to")
    if args.dry_run:
        dry = client.jobs.backfill_dry_run(ident, start, end)
        print(dump(dry) if args.json else f"{dry.count} occurrences to run; first: {', '.join(map(cell, dry.first))}")
        return OK
    options = {"rate_per_sec": args.rate, "overlap_policy": args.overlap}
    created = client.jobs.backfill(ident, start, end, **{k: v for k, v in options.items() if v is not None})
    if args.wait:
        return follow_backfill(client, created, args)
    print_backfill(args, created)
    return OK


def backfills(client: Client, args: argparse.Namespace) -> int:
    found = list(islice(client.jobs.backfills(job_id(client, args.id), page_size=min(args.limit, 200)), args.limit))
    if args.json:
        print(dump(found))
        return OK
    rows = [
        (b.backfill_id, b.state, b.range_from, b.range_to, b.total, b.created, b.finished, b.created_at) for b in found
    ]
    print(table(("BACKFILL ID", "STATE", "FROM", "TO", "TOTAL", "CREATED", "FINISHED", "CREATED AT"), rows))
    return OK


def backfill_status(client: Client, args: argparse.Namespace) -> int:
    current = client.jobs.get_backfill(args.id)
    if args.wait:
        return follow_backfill(client, current, args)
    print_backfill(args, current)
    return OK


def backfill_cancel(client: Client, args: argparse.Namespace) -> int:
    print_backfill(args, client.jobs.cancel_backfill(args.id))
    return OK


def trigger(client: Client, args: argparse.Namespace) -> int:
    triggered = client.jobs.trigger(job_id(client, args.id))
    if args.wait:
        return follow(client, triggered.execution_id, args)
    print(
        dump(triggered)
        if args.json
        else f"execution {triggered.execution_id} (scheduled for {cell(triggered.scheduled_for)})"
    )
    return OK


def preview(client: Client, args: argparse.Namespace) -> int:
    ident = job_id(client, args.id)
    found = client.jobs.preview(ident, args.count)
    if args.json:
        print(dump(found))
        return OK
    rows = ((local_and_utc(f.fire_at, found.timezone), f.scheduled_for, f.fire_at) for f in found.fires)
    print(table((f"FIRES ({found.timezone})", "SCHEDULED FOR", "FIRE AT"), rows))
    return OK


def audit(client: Client, args: argparse.Namespace) -> int:
    trail = client.jobs.audit(job_id(client, args.id), actions=args.action or (), page_size=min(args.limit, 200))
    entries = list(islice(trail, args.limit))
    print(dump(entries) if args.json else table(AUDIT_COLUMNS, map(audit_row, entries)))
    return OK


def create_parser(subparsers: Any) -> None:
    parser = sub(
        subparsers,
        "create",
        "Register a job (say when with one of --delay, --at, --cron, --every, --after).",
        create,
    )
    parser.add_argument("--name", required=True, help="A label for people (`sundial jobs get NAME` finds it).")
    parser.add_argument(
        "--key",
        help="Your unique name for the job in your tenant (`sundial jobs get KEY` finds it): creating the same job "
        f"under it again prints the registered one; another definition under it fails (exit {CONFLICT}).",
    )
    parser.add_argument("--pool", required=True, help="Worker pool the job runs in.")
    parser.add_argument("--handler", required=True, help="Handler inside the pool.")
    when = parser.add_argument_group("when (exactly one)")
    when.add_argument("--delay", type=int, metavar="SECONDS", help="DELAYED: run once, this many seconds from now.")
    when.add_argument(
        "--at",
        action="append",
        metavar="INSTANT",
        help="ONE_SHOT: run once at this RFC 3339 instant; repeat it for a RUN_LIST (one run at each instant).",
    )
    when.add_argument("--cron", metavar="EXPR", help='CRON: e.g. "0 3 * * *" (in --tz).')
    when.add_argument("--every", type=int, metavar="SECONDS", help="INTERVAL: every this many seconds.")
    when.add_argument(
        "--after",
        action="append",
        metavar="JOB[:ON]",
        help="DEPENDENT: run after this job's (id or name) execution ends SUCCEEDED (default), FAILED or ANY; "
        "repeat for a fan-in (runs once every parent has a new qualifying execution).",
    )
    parser.add_argument("--tz", help="IANA time zone of the schedule (default UTC).")
    parser.add_argument("--payload", metavar="JSON", help="JSON object handed to the handler.")
    parser.add_argument("--start-at", metavar="INSTANT")
    parser.add_argument("--end-at", metavar="INSTANT")
    parser.add_argument("--max-runs", type=int)
    parser.add_argument("--jitter", type=int, metavar="SECONDS", help="Delay each fire by up to this much.")
    parser.add_argument("--timeout", type=int, metavar="SECONDS", help="Seconds one attempt may run.")
    parser.add_argument("--overlap", choices=OVERLAP_POLICIES)
    parser.add_argument("--catchup", choices=CATCHUP_POLICIES)
    parser.add_argument("--priority", choices=PRIORITIES)
    retries = parser.add_argument_group("retries (the server's defaults for what is left out)")
    retries.add_argument("--max-attempts", type=positive, help="Attempts in total before the execution is DEAD.")
    retries.add_argument("--backoff", type=str.upper, choices=BACKOFFS, help="How the delay grows between attempts.")
    retries.add_argument("--initial-delay-ms", type=int, metavar="MS", help="Delay before the first retry.")
    retries.add_argument("--max-delay-ms", type=int, metavar="MS", help="Upper bound of any retry delay.")
    retries.add_argument(
        "--retry-jitter", action=argparse.BooleanOptionalAction, help="Randomize each retry delay (default on)."
    )


def update_parser(subparsers: Any) -> None:
    parser = sub(subparsers, "update", "Change a job's fields (the others keep their values).", update)
    parser.add_argument("id", metavar="JOB")
    parser.add_argument("--name")
    parser.add_argument("--payload", metavar="JSON")
    parser.add_argument("--cron", metavar="EXPR")
    parser.add_argument("--every", type=int, metavar="SECONDS")
    parser.add_argument("--tz")
    parser.add_argument("--end-at", metavar="INSTANT")
    parser.add_argument("--max-runs", type=int)
    parser.add_argument("--timeout", type=int, metavar="SECONDS")
    parser.add_argument("--jitter", type=int, metavar="SECONDS")
    parser.add_argument("--if-match", type=int, metavar="VERSION", help="Refuse (exit 5) if the job changed since.")


def backfill_parsers(subparsers: Any) -> None:
    parser = sub(
        subparsers,
        "backfill",
        "Run a recurring job's past occurrences of [--from, --to) that have no execution.",
        backfill,
    )
    parser.add_argument("id", metavar="JOB")
    parser.add_argument("--from", dest="start", required=True, metavar="INSTANT")
    parser.add_argument("--to", dest="end", required=True, metavar="INSTANT")
    parser.add_argument("--rate", type=float, metavar="PER_SEC", help="Occurrences per second (default 10).")
    parser.add_argument("--overlap", choices=["ALLOW", "BUFFER_ONE"])
    parser.add_argument("--dry-run", action="store_true", help="Only count; create nothing.")
    for command in (parser, sub(subparsers, "backfill-status", "Show a backfill's progress.", backfill_status)):
        if command is not parser:
            command.add_argument("id", metavar="BACKFILL_ID")
        command.add_argument(
            "--wait",
            action="store_true",
            help="Show progress until every execution it creates has ended (exit 0 if DONE, 1 if CANCELLED).",
        )
        command.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="Poll interval.")
    sub(subparsers, "backfill-cancel", "Cancel a backfill: no more executions.", backfill_cancel).add_argument(
        "id", metavar="BACKFILL_ID"
    )
    listing = sub(subparsers, "backfills", "List a job's backfills, newest first.", backfills)
    listing.add_argument("id", metavar="JOB")
    listing.add_argument("--limit", type=positive, default=100, help="At most this many (default 100).")


def parser() -> argparse.ArgumentParser:
    top, subparsers = top_parser(
        "sundial jobs",
        "Register, list, read, change, pause, resume, trigger, preview, backfill and cancel jobs. "
        "JOB is a job's id, its key or its name.",
    )
    create_parser(subparsers)
    listing = sub(subparsers, "list", "List jobs, newest first.", list_jobs)
    listing.add_argument("--state", type=str.upper, choices=JOB_STATES)
    listing.add_argument("--type", type=str.upper, choices=JOB_TYPES)
    listing.add_argument("--pool")
    listing.add_argument("--handler")
    listing.add_argument("--name-prefix", metavar="PREFIX")
    listing.add_argument("--key", help="Only the job registered with this key.")
    listing.add_argument("--limit", type=positive, default=100, help="At most this many jobs (default 100).")
    sub(subparsers, "get", "Show a job and its latest executions.", get).add_argument("id", metavar="JOB")
    update_parser(subparsers)
    sub(subparsers, "pause", "Pause a job: no fires until resumed.", pause).add_argument("id", metavar="JOB")
    sub(subparsers, "resume", "Resume a paused job.", resume).add_argument("id", metavar="JOB")
    deleting = sub(subparsers, "delete", "Cancel a job: no more fires.", delete)
    deleting.add_argument("id", metavar="JOB")
    deleting.add_argument(
        "--cascade",
        action="store_true",
        help=f"Also cancel the DEPENDENT jobs that run after it (without it: exit {CONFLICT}).",
    )
    backfill_parsers(subparsers)
    triggering = sub(subparsers, "trigger", "Run a job once now; prints the execution id.", trigger)
    triggering.add_argument("id", metavar="JOB")
    triggering.add_argument(
        "--wait", action="store_true", help="Follow the run until it ends (exit 0 if it SUCCEEDED, 1 otherwise)."
    )
    triggering.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="Poll interval.")
    previewing = sub(subparsers, "preview", "A job's next fires, in its zone (with the offset) and in UTC.", preview)
    previewing.add_argument("id", metavar="JOB")
    previewing.add_argument("--count", type=positive, default=10)
    audit_parser(subparsers, audit, "a job", "JOB")
    return top


def jobs_main(argv: list[str] | None = None) -> int:
    """Register, list, change, pause, resume, trigger, backfill and cancel jobs over the API"""
    return main(parser, argv)
