"""How jobs, executions, attempts and audit entries read in a terminal: rows of tables and detail views.

A job's instants are shown on its own zone's wall clock with the offset, and in UTC beside it; an execution's
attempts with their progress and their whole error (and traceback, when the API has one).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sundial_client.cli.common import cell

if TYPE_CHECKING:
    from sundial_client.models import Attempt, AuditEntry, Backfill, Execution, ExecutionDetail, Job, PoolDetail

JOB_COLUMNS = ("JOB ID", "NAME", "STATE", "WHEN", "POOL", "HANDLER", "NEXT FIRE", "FIRES")
EXECUTION_COLUMNS = ("EXECUTION ID", "JOB", "HANDLER", "POOL", "STATE", "ATTEMPT", "SCHEDULED FOR", "STARTED", "ERROR")
AUDIT_COLUMNS = ("AT", "ACTION", "FROM", "TO", "ACTOR", "DETAIL")


def zone(name: str) -> ZoneInfo | None:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


def local(value: datetime | None, timezone: str) -> str:
    """``value`` on the wall clock of ``timezone`` with its offset (``2026-11-29 03:00:00-08:00``)."""
    if value is None:
        return "-"
    where = zone(timezone)
    if where is None or timezone == "UTC":
        return cell(value)
    return value.astimezone(where).isoformat(sep=" ")


def local_and_utc(value: datetime | None, timezone: str) -> str:
    if value is None or timezone == "UTC":
        return cell(value)
    return f"{local(value, timezone)} {timezone} ({cell(value)})"


def when(job: Job) -> str:
    kind = str(job.type)
    if kind == "CRON":
        return f"cron {job.schedule} {job.timezone}"
    if kind == "INTERVAL":
        return f"every {job.interval_sec}s"
    if kind == "DELAYED":
        return f"after {job.delay_seconds}s"
    if kind == "RUN_LIST":
        return f"{len(job.run_list or [])} instants"
    if kind == "DEPENDENT":
        return "after its parents"
    return f"at {local(job.run_at, job.timezone)}"


def state_text(job: Job) -> str:
    """The job's state, and its latest execution's beside it: a one-shot job COMPLETED whose work waits says so."""
    latest = job.latest_execution_state
    return f"{job.state} (last run {latest})" if latest else job.state


def pool_detail_text(pool: PoolDetail) -> str:
    """A pool as its tenant sees it: live workers with their handlers and free slots, the caller's backlog."""
    w, b = pool.workers, pool.backlog
    lines = [
        f"pool {pool.name}  ({pool.kind}, owner {pool.owner})",
        f"  workers:  {w.live} live, {w.free_slots} free slots; handlers: {', '.join(w.handlers) or '-'}",
        f"  backlog:  {b.pending} pending" + (f", oldest since {cell(b.oldest_pending_at)}" if b.pending else ""),
    ]
    lines += [f"  warning:  {warning}" for warning in pool.warnings]
    for worker in w.items:
        lines.append(
            f"    {worker.worker_id}  {worker.free_slots}/{worker.concurrency} free  {', '.join(worker.handlers)}"
            f"  ({worker.host} pid {worker.pid}, {worker.version}, since {cell(worker.started_at)})"
        )
    return "\n".join(lines)


def job_row(job: Job) -> list[Any]:
    return [
        job.job_id,
        job.name,
        state_text(job),
        when(job),
        job.target.pool,
        job.target.handler,
        local(job.next_fire_at, job.timezone),
        job.fire_count,
    ]


def job_text(job: Job) -> str:
    retry = job.retry_policy
    policy = ", ".join(f"{k} {v}" for k, v in retry.items()) if retry else "-"
    lines = [
        f"job {job.job_id}  {job.name}  {state_text(job)}  (version {job.version})",
        *([f"  key:      {job.key}"] if job.key else []),
        f"  when:     {when(job)}",
        f"  target:   {job.target.pool} / {job.target.handler}",
        f"  next:     {local_and_utc(job.next_fire_at, job.timezone)}  (fired {job.fire_count}, "
        f"missed {job.missed_fires})",
        f"  retries:  {policy}",
        f"  payload:  {json.dumps(job.payload)}",
    ]
    return "\n".join(lines)


def first_line(text: str | None, width: int = 60) -> str | None:
    return text.splitlines()[0][:width] if text else None


def execution_row(e: Execution, names: Mapping[str, str]) -> list[Any]:
    return [
        e.execution_id,
        names.get(e.job_id, e.job_id),
        e.handler,
        e.pool,
        e.state,
        f"{e.attempt}/{e.max_attempts}",
        e.scheduled_for,
        e.started_at,
        first_line(e.error),
    ]


def execution_text(e: Execution) -> str:
    lines = [
        f"execution {e.execution_id}  {e.state}  attempt {e.attempt}/{e.max_attempts}",
        f"  job:        {e.job_id}  ({e.pool} / {e.handler}{', triggered' if e.triggered else ''})",
        f"  scheduled:  {cell(e.scheduled_for)}   started: {cell(e.started_at)}   finished: {cell(e.finished_at)}",
        f"  worker:     {cell(e.worker_id)}",
    ]
    if e.fence_token == 0 and e.state == "PENDING":
        lines.append("  waiting:    for its shard's leader to dispatch it")
    if e.next_attempt_at is not None:
        lines.append(f"  next try:   {cell(e.next_attempt_at)}")
    if e.error:
        lines.append(f"  error:      {first_line(e.error, 200)}")
    if e.result is not None:
        lines.append(f"  result:     {json.dumps(e.result)}")
    if e.trace_id:
        lines.append(f"  trace:      {e.trace_link or e.trace_id}")
    return "\n".join(lines)


def indented(text: str, prefix: str = "      ") -> list[str]:
    return [prefix + line for line in text.rstrip().splitlines()]


def attempt_text(a: Attempt) -> list[str]:
    """One attempt: who ran it and when, its progress, its whole error and its traceback if the API has one."""
    lines = [f"  attempt {a.attempt}  {a.state}  on {a.worker_id}  {cell(a.started_at)} → {cell(a.finished_at)}"]
    if a.progress is not None:
        lines.append(f"    progress: {json.dumps(a.progress)}")
    if a.error:
        lines.append("    error:")
        lines += indented(a.error)
    if a.traceback:
        lines.append("    traceback:")
        lines += indented(a.traceback)
    if a.log_tail:
        lines.append("    logged:")
        lines += indented("\n".join(a.log_tail))
    return lines


def execution_detail_text(e: ExecutionDetail) -> str:
    lines = [execution_text(e)]
    if e.waiting_for:
        lines.append(f"  waiting:    {e.waiting_for}")
    if e.attempts:
        lines.append("\nattempts:")
        for a in e.attempts:
            lines += attempt_text(a)
    return "\n".join(lines)


def watch_line(e: ExecutionDetail, now: datetime) -> str:
    """One line per change of a watched execution: state, attempt, worker, progress, next try, error."""
    extra = f"  next try {cell(e.next_attempt_at)}" if e.next_attempt_at else ""
    current = e.attempts[-1] if e.attempts else None
    if current is not None and current.progress is not None:
        extra += f"  progress {json.dumps(current.progress, separators=(',', ':'))}"
    extra += f"  error: {first_line(e.error, 200)}" if e.error else ""
    worker = f"  on {e.worker_id}" if e.worker_id else ""
    return f"{cell(now)}  {e.state}  attempt {e.attempt}/{e.max_attempts}{worker}{extra}"


def backfill_text(b: Backfill) -> str:
    return (
        f"backfill {b.backfill_id} {b.state}: {b.created}/{b.total} created, {b.finished} finished "
        f"(job {b.job_id}, {cell(b.range_from)} to {cell(b.range_to)})"
    )


def audit_row(entry: AuditEntry) -> list[Any]:
    detail = json.dumps(entry.detail, separators=(",", ":")) if entry.detail else None
    return [entry.at, entry.action, entry.from_state, entry.to_state, entry.actor, detail]
