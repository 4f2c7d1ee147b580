"""Executions: the execution and attempt views (`GET /v1/executions/{id}`) and their pages."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from pydantic import ConfigDict, Field

from sundial_client.models.common import ViewModel


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
    """Orders a tenant's work in its pool (docs/guides/priority.md); never across tenants."""

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
    fence_token: int = Field(
        description="Leadership token of the dispatcher that created it (for dedupe); 0 while a manual run waits "
        "for its shard leader to create it."
    )
    pool: str
    handler: str
    priority: Priority = Field(
        description="The job's priority when this execution was dispatched (a later PATCH of the job changes its "
        "next fires, not this). Orders work within the tenant: see the priority guide."
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

    @property
    def ended(self) -> bool:
        """Nothing more will happen to it by itself: not pending or running, and no retry scheduled."""
        return self.state not in (ExecutionState.PENDING, ExecutionState.RUNNING) and self.next_attempt_at is None


class Attempt(ViewModel):
    # Kept, not dropped: what a newer server adds to an attempt (its traceback, say) reaches `sundial executions
    # get` before this client knows the field.
    model_config = ConfigDict(extra="allow")

    attempt: int
    worker_id: str
    state: str
    started_at: datetime
    finished_at: datetime | None
    error: str | None
    traceback: str | None = Field(
        None,
        description="For an attempt whose handler raised: its traceback as Python prints it, from the handler's own "
        "first frame (the last 16 KB: the innermost frames). Null otherwise.",
    )
    log_tail: list[str] | None = Field(
        None,
        description="The last lines the handler logged through `ctx.logger` during this attempt (at most 200 "
        "lines / 32 KB, oldest first, each `<time> <LEVEL> <message>`). Null if it logged nothing.",
    )
    progress: Any = Field(description="The last progress the handler reported by heartbeat.")


class ExecutionDetail(Execution):
    attempts: list[Attempt] = Field(description="Every attempt, oldest first.")
    waiting_for: str | None = Field(
        None,
        description='What a PENDING execution waits for beyond its turn, e.g. "no live worker in pool files"; null '
        "when nothing holds it.",
    )


class ExecutionPage(ViewModel):
    items: list[Execution] = Field(description="Newest occurrence first.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")


class ExecutionList(ViewModel):
    items: list[Execution] = Field(description="Newest first.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")
