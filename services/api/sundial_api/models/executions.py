"""Executions: the execution and attempt views (`GET /v1/executions/{id}`) and their pages."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import Field
from sundial_common.security.encryption import PROGRESS, RESULT, TenantCipher

from sundial_api.models.common import ViewModel


class ExecutionState(enum.StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    CANCELLED = "CANCELLED"
    FAILED_WORKER_LOST = "FAILED_WORKER_LOST"
    DEAD = "DEAD"
    SKIPPED = "SKIPPED"


class Priority(enum.StrEnum):
    """Orders a tenant's work in its pool (README "Priority"); never across tenants."""

    LOW = "LOW"
    NORMAL = "NORMAL"
    HIGH = "HIGH"


class Execution(ViewModel):
    """One occurrence of a job and its current attempt."""

    execution_id: str
    job_id: str
    scheduled_for: datetime = Field(description="The occurrence's nominal time (unique per job).")
    fire_at: datetime | None = Field(description="When it was due to fire: `scheduledFor` plus the job's jitter.")
    triggered: bool = Field(description="A manual run (`POST /v1/jobs/{id}/trigger`), outside the schedule.")
    caused_by: list[str] | None = Field(
        None,
        description="A DEPENDENT job's run: the parent executions it ran after (its trace links to theirs). "
        "Null for runs of a schedule or a manual trigger.",
    )
    cancel_requested_at: datetime | None = Field(description="When it was asked to stop (e.g. CANCEL_RUNNING).")
    state: ExecutionState
    attempt: int = Field(description="The current attempt, from 1.")
    max_attempts: int
    next_attempt_at: datetime | None = Field(
        None, description="While a retry is scheduled (after a failed attempt with attempts left): when it is due."
    )
    held_by: str | None = Field(
        None,
        description="The retry circuit breaker holding this retry (`GET /v1/breakers/{id}`): the execution keeps "
        "its failed state and attempt number, and `nextAttemptAt` is pushed out to the breaker's next probe until "
        "the breaker closes and releases it. Null when no breaker holds it.",
    )
    shard: int
    fence_token: int = Field(description="Leadership token of the dispatcher that created it (for dedupe).")
    pool: str
    handler: str
    priority: Priority = Field(
        description="The job's priority when this execution was dispatched (a later PATCH of the job changes its "
        'next fires, not this). Orders work within the tenant: README "Priority".'
    )
    worker_id: str | None
    created_at: datetime
    published_at: datetime | None = Field(description="When it was handed to the broker.")
    started_at: datetime | None
    finished_at: datetime | None
    result: Any = Field(description="What the handler returned (JSON), once SUCCEEDED.")
    error: str | None
    trace_id: str | None = Field(description="OpenTelemetry trace id: the request, dispatch and run are one trace.")
    trace_link: str | None = Field(
        description="Where to look the trace up (Jaeger UI). Only when this server exports traces "
        "(`SUNDIAL_OTLP_ENDPOINT` set) and has a link template (`SUNDIAL_TRACE_LINK_TEMPLATE`, Jaeger's "
        "`/trace/{trace_id}` by default); null otherwise — the local stack (`make run`) starts no trace viewer. "
        "`traceId` is there either way."
    )


class Attempt(ViewModel):
    attempt: int
    worker_id: str
    state: str
    started_at: datetime
    finished_at: datetime | None
    error: str | None
    progress: Any = Field(description="The last progress the handler reported by heartbeat.")


class ExecutionDetail(Execution):
    attempts: list[Attempt] = Field(description="Every attempt, oldest first.")


class ExecutionPage(ViewModel):
    items: list[Execution] = Field(description="Newest occurrence first.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")


class ExecutionList(ViewModel):
    items: list[Execution] = Field(description="Newest first.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")


def render_execution(row: Mapping[str, Any], trace_link_template: str | None, cipher: TenantCipher) -> dict[str, Any]:
    """An ``executions`` row as the Execution view (result and error opened with the tenant's ``cipher``);
    ``trace_link_template`` None (no trace backend): no link."""
    trace_id = row["trace_id"]
    return {
        "executionId": str(row["id"]),
        "jobId": str(row["job_id"]),
        "scheduledFor": row["scheduled_for"],
        "fireAt": row["fire_at"],
        "triggered": row["triggered"],
        "causedBy": [str(i) for i in row["caused_by"]] if row.get("caused_by") else None,
        "cancelRequestedAt": row["cancel_requested_at"],
        "state": row["state"],
        "attempt": row["attempt"],
        "maxAttempts": row["max_attempts"],
        "nextAttemptAt": row.get("next_attempt_at"),
        "heldBy": str(row["held_by"]) if row.get("held_by") is not None else None,
        "shard": row["shard"],
        "fenceToken": row["fence_token"],
        "pool": row["pool"],
        "handler": row["handler"],
        "priority": row["priority"],
        "workerId": row["worker_id"],
        "createdAt": row["created_at"],
        "publishedAt": row["published_at"],
        "startedAt": row["started_at"],
        "finishedAt": row["finished_at"],
        "result": cipher.open_json(row["result"], RESULT),
        "error": cipher.open_error(row["error"]),
        "traceId": trace_id,
        "traceLink": trace_link_template.format(trace_id=trace_id) if trace_id and trace_link_template else None,
    }


def render_attempt(row: Mapping[str, Any], cipher: TenantCipher) -> dict[str, Any]:
    """An ``execution_attempts`` row as the Attempt view."""
    return {
        "attempt": row["attempt"],
        "workerId": row["worker_id"],
        "state": row["state"],
        "startedAt": row["started_at"],
        "finishedAt": row["finished_at"],
        "error": cipher.open_error(row["error"]),
        "progress": cipher.open_json(row["progress"], PROGRESS),
    }
