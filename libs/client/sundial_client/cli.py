"""``sundial jobs …`` and ``sundial executions …``: the API from a shell, over :class:`~sundial_client.Client`.

Human tables by default, ``--json`` for scripts (one JSON document; listings print a JSON array).
Where the API is and who you are, first found wins:

1. ``--url`` / ``--token`` (or ``--token-file``);
2. ``SUNDIAL_URL`` / ``SUNDIAL_TOKEN``;
3. the config file ``$SUNDIAL_CONFIG``, else ``$XDG_CONFIG_HOME/sundial/config.toml`` (``~/.config/…``):
   ``url = "https://sundial.example.com"`` and ``token = "…"`` or ``token_file = "/path"``;
4. the development stack: ``http://127.0.0.1:8080`` and the token ``make up`` writes to
   ``.sundial/dev-token`` (looked up from the current directory upwards).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from sundial_client.client import Client
from sundial_client.errors import (
    ApiError,
    BadRequest,
    Conflict,
    ConnectionFailed,
    Forbidden,
    NotFound,
    PreconditionFailed,
    RateLimited,
    Unauthorized,
    Unavailable,
)
from sundial_client.models import (
    AuditEntry,
    Backfill,
    Execution,
    ExecutionState,
    Job,
    JobState,
    JobType,
    NewJob,
    Target,
)

DEFAULT_URL = "http://127.0.0.1:8080"
DEV_TOKEN = Path(".sundial") / "dev-token"

# Exit codes scripts can rely on (also in every --help).
OK = 0
FAILED = 1  # an unexpected server error, or `watch` saw the execution end other than SUCCEEDED
USAGE = 2  # bad command line (argparse's own code) or missing configuration
NOT_FOUND = 3
INVALID = 4  # 400/413/422: the problem's field messages are printed
CONFLICT = 5  # 409/412: the state (or version) does not allow it
AUTH = 6  # 401/403
UNAVAILABLE = 7  # unreachable, or 429/503 after every retry

EXIT_CODES = f"""\
exit codes:
  {OK}  done (`watch`: the execution SUCCEEDED)
  {FAILED}  server error, or `watch`: the execution ended otherwise (FAILED, DEAD, CANCELLED, …)
  {USAGE}  bad arguments or configuration
  {NOT_FOUND}  no such job or execution (for this tenant)
  {INVALID}  invalid input: each field at fault is printed
  {CONFLICT}  the job's or execution's state (or version) does not allow it
  {AUTH}  missing, invalid or insufficient token
  {UNAVAILABLE}  the API is unreachable or overloaded (after retries)

connection: --url/--token, else SUNDIAL_URL/SUNDIAL_TOKEN, else $SUNDIAL_CONFIG or
~/.config/sundial/config.toml (url = "…", token = "…" or token_file = "…"), else the dev stack
({DEFAULT_URL} and .sundial/dev-token).
"""


class UsageError(Exception):
    pass


# --- connection -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Connection:
    url: str
    token: str | None


def _config_file(env: dict[str, str]) -> Path:
    if "SUNDIAL_CONFIG" in env:
        return Path(env["SUNDIAL_CONFIG"])
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "sundial" / "config.toml"


def _dev_token(start: Path) -> Path | None:
    for directory in (start, *start.parents):
        if (directory / DEV_TOKEN).is_file():
            return directory / DEV_TOKEN
    return None


def _read_token(path: str | Path) -> str:
    try:
        return Path(path).expanduser().read_text().strip()
    except OSError as exc:
        raise UsageError(f"cannot read the token file {path}: {exc.strerror}") from None


def resolve_connection(
    args: argparse.Namespace, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Connection:
    """The API's URL and token from flags, environment, config file or the dev stack, in that order."""
    env = dict(os.environ) if env is None else env
    config: dict[str, Any] = {}
    path = _config_file(env)
    if path.is_file():
        try:
            config = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, OSError) as exc:
            raise UsageError(f"config file {path}: {exc}") from None
    url = args.url or env.get("SUNDIAL_URL") or config.get("url") or DEFAULT_URL
    token: str | None = None
    if args.token:
        token = args.token
    elif args.token_file:
        token = _read_token(args.token_file)
    elif env.get("SUNDIAL_TOKEN"):
        token = env["SUNDIAL_TOKEN"]
    elif config.get("token"):
        token = str(config["token"])
    elif config.get("token_file"):
        token = _read_token(str(config["token_file"]))
    else:
        dev = _dev_token(cwd or Path.cwd())
        token = _read_token(dev) if dev is not None else None
    return Connection(str(url), token)


# --- output ---------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def _dump(value: BaseModel | list[BaseModel]) -> str:
    if isinstance(value, list):
        return json.dumps([v.model_dump(mode="json", by_alias=True) for v in value], indent=2)
    return json.dumps(value.model_dump(mode="json", by_alias=True), indent=2)


def _when(job: Job) -> str:
    if job.type is JobType.CRON:
        return f"cron {job.schedule} {job.timezone}"
    if job.type is JobType.INTERVAL:
        return f"every {job.interval_sec}s"
    if job.type is JobType.DELAYED:
        return f"after {job.delay_seconds}s"
    if job.type is JobType.RUN_LIST:
        return f"{len(job.run_list or [])} instants"
    return f"at {_cell(job.run_at)}"


JOB_COLUMNS = ("JOB ID", "NAME", "STATE", "WHEN", "POOL", "HANDLER", "NEXT FIRE", "FIRES")
EXECUTION_COLUMNS = ("EXECUTION ID", "JOB ID", "STATE", "ATTEMPT", "SCHEDULED FOR", "WORKER", "ERROR")


def _job_row(job: Job) -> list[Any]:
    return [
        job.job_id,
        job.name,
        job.state,
        _when(job),
        job.target.pool,
        job.target.handler,
        job.next_fire_at,
        job.fire_count,
    ]


def _execution_row(e: Execution) -> list[Any]:
    error = (e.error or "").splitlines()[0][:60] if e.error else None
    return [e.execution_id, e.job_id, e.state, f"{e.attempt}/{e.max_attempts}", e.scheduled_for, e.worker_id, error]


def _job_text(job: Job) -> str:
    lines = [
        f"job {job.job_id}  {job.name}  {job.state}  (version {job.version})",
        f"  when:     {_when(job)}",
        f"  target:   {job.target.pool} / {job.target.handler}",
        f"  next:     {_cell(job.next_fire_at)}  (fired {job.fire_count}, missed {job.missed_fires})",
        f"  payload:  {json.dumps(job.payload)}",
    ]
    return "\n".join(lines)


def _execution_text(e: Execution) -> str:
    lines = [
        f"execution {e.execution_id}  {e.state}  attempt {e.attempt}/{e.max_attempts}",
        f"  job:        {e.job_id}  ({e.pool} / {e.handler}{', triggered' if e.triggered else ''})",
        f"  scheduled:  {_cell(e.scheduled_for)}   started: {_cell(e.started_at)}   finished: {_cell(e.finished_at)}",
        f"  worker:     {_cell(e.worker_id)}",
    ]
    if e.next_attempt_at is not None:
        lines.append(f"  next try:   {_cell(e.next_attempt_at)}")
    if e.error:
        lines.append(f"  error:      {e.error}")
    if e.result is not None:
        lines.append(f"  result:     {json.dumps(e.result)}")
    if e.trace_id:
        lines.append(f"  trace:      {e.trace_link or e.trace_id}")
    return "\n".join(lines)


# --- commands -------------------------------------------------------------------------------------


def _payload(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--payload is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError("--payload must be a JSON object, e.g. '{\"userId\": 42}'")
    return value


def _instant(text: str, flag: str) -> datetime:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise UsageError(f"{flag} `{text}` is not an RFC 3339 instant such as 2027-01-01T09:00:00Z") from None


def _new_job(args: argparse.Namespace) -> NewJob:
    when = [flag for flag in ("delay", "at", "cron", "every", "after") if getattr(args, flag)]
    if len(when) != 1:
        raise UsageError(
            "say when with exactly one of --delay SECONDS, --at INSTANT, --cron EXPR, --every SECONDS, "
            "--after JOB_ID[:SUCCEEDED|FAILED|ANY]"
        )
    fields: dict[str, Any] = {
        "name": args.name,
        "target": Target(pool=args.pool, handler=args.handler),
        "payload": _payload(args.payload),
        "timezone": args.tz,
        "start_at": _instant(args.start_at, "--start-at") if args.start_at else None,
        "end_at": _instant(args.end_at, "--end-at") if args.end_at else None,
        "max_runs": args.max_runs,
        "jitter_sec": args.jitter,
        "timeout_sec": args.timeout,
        "overlap_policy": args.overlap,
        "catchup_policy": args.catchup,
        "priority": args.priority,
    }
    if args.max_attempts is not None:
        fields["retry_policy"] = {"maxAttempts": args.max_attempts}
    if args.delay is not None:
        fields.update(type=JobType.DELAYED, delay_seconds=args.delay)
    elif args.at is not None:
        fields.update(type=JobType.ONE_SHOT, run_at=_instant(args.at, "--at"))
    elif args.cron is not None:
        fields.update(type=JobType.CRON, schedule=args.cron)
    elif args.every is not None:
        fields.update(type=JobType.INTERVAL, interval_sec=args.every)
    else:
        parents = [dict(zip(("job_id", "on"), a.split(":", 1), strict=False)) for a in args.after]
        fields.update(type=JobType.DEPENDENT, depends_on=parents)
    return NewJob.model_validate(fields)


def _print_job(args: argparse.Namespace, job: Job) -> None:
    print(_dump(job) if args.json else _job_text(job))


def jobs_create(client: Client, args: argparse.Namespace) -> int:
    _print_job(args, client.jobs.create(_new_job(args)))
    return OK


def jobs_list(client: Client, args: argparse.Namespace) -> int:
    found = client.jobs.list(
        state=args.state,
        type=args.type,
        pool=args.pool,
        handler=args.handler,
        name_prefix=args.name_prefix,
        page_size=min(args.limit, 200),
    )
    jobs = list(islice(found, args.limit))
    print(_dump(list(jobs)) if args.json else table(JOB_COLUMNS, map(_job_row, jobs)))
    return OK


def jobs_get(client: Client, args: argparse.Namespace) -> int:
    job = client.jobs.get(args.id)
    if args.json:
        print(_dump(job))
    else:
        print(_job_text(job))
        for title, relatives in (("runs after", job.parents), ("runs before", job.children)):
            for r in relatives:
                waiting = f", {r.waiting} waiting" if r.waiting else ""
                print(f"{title}: {r.job_id} {r.name} ({r.state}, on {r.on}{waiting})")
        if job.latest_executions:
            print("\nlatest executions:")
            print(table(EXECUTION_COLUMNS, map(_execution_row, job.latest_executions)))
    return OK


def jobs_update(client: Client, args: argparse.Namespace) -> int:
    changes: dict[str, Any] = {}
    if args.name is not None:
        changes["name"] = args.name
    if args.payload is not None:
        changes["payload"] = _payload(args.payload)
    if args.cron is not None:
        changes.update(type=JobType.CRON, schedule=args.cron)
    if args.every is not None:
        changes.update(type=JobType.INTERVAL, interval_sec=args.every)
    if args.tz is not None:
        changes["timezone"] = args.tz
    if args.end_at is not None:
        changes["end_at"] = _instant(args.end_at, "--end-at")
    if args.max_runs is not None:
        changes["max_runs"] = args.max_runs
    if args.timeout is not None:
        changes["timeout_sec"] = args.timeout
    if args.jitter is not None:
        changes["jitter_sec"] = args.jitter
    if not changes:
        raise UsageError("nothing to change: give at least one of --name, --payload, --cron, --every, --tz, …")
    _print_job(args, client.jobs.update(args.id, if_match=args.if_match, **changes))
    return OK


def jobs_delete(client: Client, args: argparse.Namespace) -> int:
    _print_job(args, client.jobs.delete(args.id, cascade=args.cascade))
    return OK


def _print_backfill(args: argparse.Namespace, backfill: Backfill) -> None:
    if args.json:
        print(_dump(backfill))
        return
    print(
        f"backfill {backfill.backfill_id} {backfill.state}: {backfill.created}/{backfill.total} created, "
        f"{backfill.finished} finished (job {backfill.job_id}, {_cell(backfill.range_from)} to "
        f"{_cell(backfill.range_to)})"
    )


def jobs_backfill(client: Client, args: argparse.Namespace) -> int:
    start, end = _instant(args.start, "--from"), _instant(args.end, "--to")
    if args.dry_run:
        dry = client.jobs.backfill_dry_run(args.id, start, end)
        print(_dump(dry) if args.json else f"{dry.count} occurrences to run; first: {', '.join(map(_cell, dry.first))}")
        return OK
    options = {"rate_per_sec": args.rate, "overlap_policy": args.overlap}
    backfill = client.jobs.backfill(args.id, start, end, **{k: v for k, v in options.items() if v is not None})
    _print_backfill(args, backfill)
    return OK


def jobs_backfill_status(client: Client, args: argparse.Namespace) -> int:
    _print_backfill(args, client.jobs.get_backfill(args.id))
    return OK


def jobs_backfill_cancel(client: Client, args: argparse.Namespace) -> int:
    _print_backfill(args, client.jobs.cancel_backfill(args.id))
    return OK


def _job_action(action: Callable[[Client, str], Job]) -> Callable[[Client, argparse.Namespace], int]:
    def run(client: Client, args: argparse.Namespace) -> int:
        _print_job(args, action(client, args.id))
        return OK

    return run


def jobs_trigger(client: Client, args: argparse.Namespace) -> int:
    triggered = client.jobs.trigger(args.id)
    print(
        _dump(triggered)
        if args.json
        else f"execution {triggered.execution_id} (scheduled for {_cell(triggered.scheduled_for)})"
    )
    return OK


def jobs_preview(client: Client, args: argparse.Namespace) -> int:
    preview = client.jobs.preview(args.id, args.count)
    if args.json:
        print(_dump(preview))
    else:
        print(
            table(
                ("SCHEDULED FOR", "FIRE AT", f"LOCAL ({preview.timezone})"),
                ((f.scheduled_for, f.fire_at, f.local) for f in preview.fires),
            )
        )
    return OK


def executions_list(client: Client, args: argparse.Namespace) -> int:
    if args.job is not None and args.state is not None:
        raise UsageError("give --state STATE (the tenant's executions in that state) or --job JOB_ID, not both")
    page_size = min(args.limit, 200)
    found = (
        client.jobs.executions(args.job, page_size=page_size)
        if args.job is not None
        else client.executions.list(args.state, page_size=page_size)
    )
    executions = list(islice(found, args.limit))
    print(_dump(list(executions)) if args.json else table(EXECUTION_COLUMNS, map(_execution_row, executions)))
    return OK


def executions_get(client: Client, args: argparse.Namespace) -> int:
    execution = client.executions.get(args.id)
    if args.json:
        print(_dump(execution))
    else:
        print(_execution_text(execution))
        if execution.attempts:
            print("\nattempts:")
            rows = ((a.attempt, a.state, a.worker_id, a.started_at, a.finished_at, a.error) for a in execution.attempts)
            print(table(("ATTEMPT", "STATE", "WORKER", "STARTED", "FINISHED", "ERROR"), rows))
    return OK


def _execution_action(action: Callable[[Client, str], Execution]) -> Callable[[Client, argparse.Namespace], int]:
    def run(client: Client, args: argparse.Namespace) -> int:
        execution = action(client, args.id)
        print(_dump(execution) if args.json else _execution_text(execution))
        return OK

    return run


def executions_trace_link(client: Client, args: argparse.Namespace) -> int:
    execution = client.executions.get(args.id)
    link = execution.trace_link or execution.trace_id
    if link is None:
        print(f"execution {args.id} has no trace", file=sys.stderr)
        return NOT_FOUND
    print(json.dumps({"traceId": execution.trace_id, "traceLink": execution.trace_link}) if args.json else link)
    return OK


def executions_watch(client: Client, args: argparse.Namespace) -> int:
    last = None
    for last in client.executions.watch(args.id, poll_sec=args.interval):
        if args.json:
            print(json.dumps(last.model_dump(mode="json", by_alias=True)), flush=True)
        else:
            extra = f"  next try {_cell(last.next_attempt_at)}" if last.next_attempt_at else ""
            extra += f"  error: {last.error.splitlines()[0]}" if last.error else ""
            worker = f"  on {last.worker_id}" if last.worker_id else ""
            now = _cell(datetime.now().astimezone())
            print(f"{now}  {last.state}  attempt {last.attempt}/{last.max_attempts}{worker}{extra}", flush=True)
    assert last is not None
    return OK if last.state is ExecutionState.SUCCEEDED else FAILED


# --- parsers --------------------------------------------------------------------------------------


AUDIT_COLUMNS = ("AT", "ACTION", "FROM", "TO", "ACTOR", "DETAIL")


def _audit_row(entry: AuditEntry) -> list[Any]:
    detail = json.dumps(entry.detail, separators=(",", ":")) if entry.detail else None
    return [entry.at, entry.action, entry.from_state, entry.to_state, entry.actor, detail]


def _audit_command(kind: str) -> Callable[[Client, argparse.Namespace], int]:
    def run(client: Client, args: argparse.Namespace) -> int:
        trail = client.jobs.audit if kind == "jobs" else client.executions.audit
        entries = list(islice(trail(args.id, actions=args.action or (), page_size=min(args.limit, 200)), args.limit))
        print(_dump(list(entries)) if args.json else table(AUDIT_COLUMNS, map(_audit_row, entries)))
        return OK

    return run


def _audit_parser(sub: Any, kind: str, what: str) -> None:
    audit = _sub(
        sub,
        "audit",
        f"Show {what}'s audit trail, oldest first: every change, who made it (the token's subject), the state "
        "before and after.",
        _audit_command(kind),
    )
    audit.add_argument("id")
    audit.add_argument(
        "--action", action="append", metavar="ACTION", help="Only this action (repeatable), e.g. --action cancel."
    )
    audit.add_argument("--limit", type=_positive, default=1000, help="At most this many entries (default 1000).")


def _common(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection")
    group.add_argument("--url", help=f"API base URL (env SUNDIAL_URL; default {DEFAULT_URL}).")
    group.add_argument("--token", help="Bearer token (env SUNDIAL_TOKEN).")
    group.add_argument("--token-file", help="Read the bearer token from this file.")
    parser.add_argument("--json", action="store_true", help="Print JSON (the API's own shapes) instead of text.")


def _sub(
    subparsers: Any, name: str, help: str, run: Callable[[Client, argparse.Namespace], int]
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=help, description=help, epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _common(parser)
    parser.set_defaults(run=run)
    return parser


def _jobs_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sundial jobs",
        description="Register, list, read, change, pause, resume, trigger, preview and cancel jobs.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    create = _sub(sub, "create", "Register a job (say when with one of --delay, --at, --cron, --every).", jobs_create)
    create.add_argument("--name", required=True)
    create.add_argument("--pool", required=True, help="Worker pool the job runs in.")
    create.add_argument("--handler", required=True, help="Handler inside the pool.")
    create.add_argument("--delay", type=int, metavar="SECONDS", help="DELAYED: run once, this many seconds from now.")
    create.add_argument("--at", metavar="INSTANT", help="ONE_SHOT: run once at this RFC 3339 instant.")
    create.add_argument("--cron", metavar="EXPR", help='CRON: e.g. "0 3 * * *" (in --tz).')
    create.add_argument("--every", type=int, metavar="SECONDS", help="INTERVAL: every this many seconds.")
    create.add_argument(
        "--after",
        action="append",
        metavar="JOB_ID[:ON]",
        help="DEPENDENT: run after this job's execution ends SUCCEEDED (default), FAILED or ANY; repeat for a "
        "fan-in (runs once every parent has a new qualifying execution).",
    )
    create.add_argument("--tz", help="IANA time zone of the schedule (default UTC).")
    create.add_argument("--payload", metavar="JSON", help="JSON object handed to the handler.")
    create.add_argument("--start-at", metavar="INSTANT")
    create.add_argument("--end-at", metavar="INSTANT")
    create.add_argument("--max-runs", type=int)
    create.add_argument("--jitter", type=int, metavar="SECONDS")
    create.add_argument("--timeout", type=int, metavar="SECONDS", help="Seconds one attempt may run.")
    create.add_argument("--max-attempts", type=int, help="Attempts in total before the execution is DEAD.")
    create.add_argument("--overlap", choices=["ALLOW", "SKIP", "BUFFER_ONE", "CANCEL_RUNNING"])
    create.add_argument("--catchup", choices=["FIRE_ONCE", "FIRE_ALL", "SKIP"])
    create.add_argument("--priority", choices=["LOW", "NORMAL", "HIGH"])

    listing = _sub(sub, "list", "List jobs, newest first.", jobs_list)
    listing.add_argument("--state", type=str.upper, choices=[s.value for s in JobState])
    listing.add_argument("--type", type=str.upper, choices=[t.value for t in JobType])
    listing.add_argument("--pool")
    listing.add_argument("--handler")
    listing.add_argument("--name-prefix", metavar="PREFIX")
    listing.add_argument("--limit", type=_positive, default=100, help="At most this many jobs (default 100).")

    _sub(sub, "get", "Show a job and its latest executions.", jobs_get).add_argument("id")

    update = _sub(sub, "update", "Change a job's fields (the others keep their values).", jobs_update)
    update.add_argument("id")
    update.add_argument("--name")
    update.add_argument("--payload", metavar="JSON")
    update.add_argument("--cron", metavar="EXPR")
    update.add_argument("--every", type=int, metavar="SECONDS")
    update.add_argument("--tz")
    update.add_argument("--end-at", metavar="INSTANT")
    update.add_argument("--max-runs", type=int)
    update.add_argument("--timeout", type=int, metavar="SECONDS")
    update.add_argument("--jitter", type=int, metavar="SECONDS")
    update.add_argument("--if-match", type=int, metavar="VERSION", help="Refuse (exit 5) if the job changed since.")

    _sub(sub, "pause", "Pause a job: no fires until resumed.", _job_action(lambda c, i: c.jobs.pause(i))).add_argument(
        "id"
    )
    _sub(sub, "resume", "Resume a paused job.", _job_action(lambda c, i: c.jobs.resume(i))).add_argument("id")
    delete = _sub(sub, "delete", "Cancel a job: no more fires.", jobs_delete)
    delete.add_argument("id")
    delete.add_argument(
        "--cascade",
        action="store_true",
        help=f"Also cancel the DEPENDENT jobs that run after it (without it: exit {CONFLICT}).",
    )
    backfill = _sub(
        sub,
        "backfill",
        "Run a recurring job's past occurrences of [--from, --to) that have no execution.",
        jobs_backfill,
    )
    backfill.add_argument("id")
    backfill.add_argument("--from", dest="start", required=True, metavar="INSTANT")
    backfill.add_argument("--to", dest="end", required=True, metavar="INSTANT")
    backfill.add_argument("--rate", type=float, metavar="PER_SEC", help="Occurrences per second (default 10).")
    backfill.add_argument("--overlap", choices=["ALLOW", "BUFFER_ONE"])
    backfill.add_argument("--dry-run", action="store_true", help="Only count; create nothing.")
    _sub(sub, "backfill-status", "Show a backfill's progress.", jobs_backfill_status).add_argument("id")
    _sub(sub, "backfill-cancel", "Cancel a backfill: no more executions.", jobs_backfill_cancel).add_argument("id")
    _sub(sub, "trigger", "Run a job once now; prints the execution id.", jobs_trigger).add_argument("id")
    preview = _sub(sub, "preview", "A job's next fires, in UTC and its zone.", jobs_preview)
    preview.add_argument("id")
    preview.add_argument("--count", type=_positive, default=10)
    _audit_parser(sub, "jobs", "a job")
    return parser


def _executions_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sundial executions",
        description="List, read, cancel, retry and follow executions (one occurrence of a job each).",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    listing = _sub(
        sub,
        "list",
        "Executions, newest first: all, in one state (--state DEAD: the dead letters), or of one job.",
        executions_list,
    )
    listing.add_argument("--state", type=str.upper, choices=[s.value for s in ExecutionState])
    listing.add_argument("--job", metavar="JOB_ID", help="Executions of this job, newest first.")
    listing.add_argument("--limit", type=_positive, default=100, help="At most this many (default 100).")
    _sub(sub, "get", "Show an execution and its attempts.", executions_get).add_argument("id")
    _sub(
        sub,
        "cancel",
        "Cancel an execution (a running one is asked to stop).",
        _execution_action(lambda c, i: c.executions.cancel(i)),
    ).add_argument("id")
    _sub(
        sub, "retry", "Give a DEAD execution one more attempt.", _execution_action(lambda c, i: c.executions.retry(i))
    ).add_argument("id")
    _sub(sub, "trace-link", "Print where the execution's trace is.", executions_trace_link).add_argument("id")
    watch = _sub(
        sub, "watch", "Follow an execution until it ends; exit 0 if it SUCCEEDED, 1 otherwise.", executions_watch
    )
    watch.add_argument("id")
    watch.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="Poll interval (default 1).")
    _audit_parser(sub, "executions", "an execution")
    return parser


def _stats_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sundial stats",
        description="The tenant's execution history, from the ClickHouse replica (seconds behind Postgres).",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    executions = _sub(
        sub, "executions", "Counts, failure rate, lateness and duration percentiles per hour or day.", stats_executions
    )
    handlers = _sub(sub, "handlers", "The slowest and the most failing handlers.", stats_handlers)
    for command in (executions, handlers):
        command.add_argument("--from", dest="start", metavar="INSTANT", help="RFC 3339 (default: 24 h / 30 d ago).")
        command.add_argument("--to", dest="end", metavar="INSTANT", help="RFC 3339, exclusive (default: now).")
    executions.add_argument("--interval", default="hour", help="`hour` (default) or `day`.")
    executions.add_argument("--group-by", help="`state`, `pool` or `handler`.")
    handlers.add_argument("--limit", type=_positive, default=10, help="Handlers per list (default 10).")
    return parser


def _instant_arg(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"`{text}` is not an RFC 3339 instant") from None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def stats_executions(client: Client, args: argparse.Namespace) -> int:
    stats = client.stats.executions(
        _instant_arg(args.start), _instant_arg(args.end), interval=args.interval, group_by=args.group_by
    )
    if args.json:
        print(_dump(stats))
        return OK
    rows = [
        (
            item.start,
            item.group or "",
            item.executions,
            item.failed,
            "-" if item.failure_rate is None else f"{item.failure_rate:.1%}",
            _ms(item.lateness_ms.p95),
            _ms(item.duration_ms.p50),
            _ms(item.duration_ms.p95),
        )
        for item in stats.items
    ]
    headers = ("START", (args.group_by or "").upper(), "EXECUTIONS", "FAILED", "FAILURE", "LATE P95 MS", "DUR P50 MS")
    print(table((*headers, "DUR P95 MS"), rows))
    return OK


def stats_handlers(client: Client, args: argparse.Namespace) -> int:
    ranking = client.stats.handlers(_instant_arg(args.start), _instant_arg(args.end), limit=args.limit)
    if args.json:
        print(_dump(ranking))
        return OK
    headers = ("POOL", "HANDLER", "EXECUTIONS", "FAILED", "FAILURE", "DUR P95 MS", "TOP ERROR")
    for title, handlers in (("slowest", ranking.slowest), ("most failing", ranking.most_failing)):
        print(f"{title}:")
        rows = [
            (
                h.pool,
                h.handler,
                h.executions,
                h.failed,
                "-" if h.failure_rate is None else f"{h.failure_rate:.1%}",
                _ms(h.duration_ms.p95),
                h.top_error_class or "",
            )
            for h in handlers
        ]
        print(table(headers, rows))
    return OK


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _exit_code(error: ApiError) -> int:
    if isinstance(error, NotFound):
        return NOT_FOUND
    if isinstance(error, BadRequest):
        return INVALID
    if isinstance(error, Conflict | PreconditionFailed):
        return CONFLICT
    if isinstance(error, Unauthorized | Forbidden):
        return AUTH
    if isinstance(error, RateLimited | Unavailable) and error.status in (429, 503):
        return UNAVAILABLE
    return FAILED


def run(parser: argparse.ArgumentParser, argv: list[str], client: Client | None = None) -> int:
    """Parse ``argv`` and run the command; ``client`` replaces the one built from the connection settings."""
    args = parser.parse_args(argv)
    prog = parser.prog
    try:
        if client is None:
            connection = resolve_connection(args)
            with Client(connection.url, token=connection.token) as own:
                return int(args.run(own, args))
        return int(args.run(client, args))
    except UsageError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return USAGE
    except ValidationError as exc:  # caught before sending: a field the API would refuse anyway
        print(f"{prog}: invalid input:", file=sys.stderr)
        for error in exc.errors():
            print(f"  {'.'.join(map(str, error['loc']))}: {error['msg']}", file=sys.stderr)
        return INVALID
    except ApiError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return _exit_code(exc)
    except ConnectionFailed as exc:
        print(f"{prog}: cannot reach the API: {exc}", file=sys.stderr)
        return UNAVAILABLE
    except KeyboardInterrupt:
        return 130


def jobs_main(argv: list[str] | None = None) -> int:
    """Register, list, change, pause, resume, trigger and cancel jobs over the API"""
    return run(_jobs_parser(), list(sys.argv[1:] if argv is None else argv))


def executions_main(argv: list[str] | None = None) -> int:
    """List, read, cancel, retry and follow executions over the API"""
    return run(_executions_parser(), list(sys.argv[1:] if argv is None else argv))


def stats_main(argv: list[str] | None = None) -> int:
    """The tenant's execution history (counts, failure rates, percentiles, handlers) over the API"""
    return run(_stats_parser(), list(sys.argv[1:] if argv is None else argv))
