"""Jobs: the job views (`GET /v1/jobs/{id}`, the job list, a trigger's answer) and the enums of the job body."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from pydantic import Field

from sundial_client.models.breakers import JobBreakerView
from sundial_client.models.common import FieldError, ViewModel
from sundial_client.models.executions import Execution, Priority
from sundial_client.models.schedules import JobType


class OverlapPolicy(enum.StrEnum):
    ALLOW = "ALLOW"
    SKIP = "SKIP"
    BUFFER_ONE = "BUFFER_ONE"
    CANCEL_RUNNING = "CANCEL_RUNNING"


class CatchupPolicy(enum.StrEnum):
    FIRE_ONCE = "FIRE_ONCE"
    FIRE_ALL = "FIRE_ALL"
    SKIP = "SKIP"


class Backoff(enum.StrEnum):
    FIXED = "FIXED"
    LINEAR = "LINEAR"
    EXPONENTIAL = "EXPONENTIAL"


class DependencyCondition(enum.StrEnum):
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    ANY = "ANY"


class JobState(enum.StrEnum):
    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"


class TargetView(ViewModel):
    pool: str
    handler: str


class Job(ViewModel):
    """A job as stored. Instants are RFC 3339 UTC (`Z`)."""

    job_id: str = Field(description="UUIDv7.")
    key: str | None = Field(
        None, description="The key the job was registered with (unique per tenant), or null: it has none."
    )
    name: str
    type: JobType
    timezone: str
    run_at: datetime | None = Field(description="ONE_SHOT: the requested instant (UTC, millisecond precision).")
    delay_seconds: int | None = Field(description="DELAYED: the requested delay.")
    schedule: str | None = Field(description="CRON: the expression, as given.")
    interval_sec: int | None = Field(description="INTERVAL: seconds between fires.")
    run_list: list[datetime] | None = Field(description="RUN_LIST: the instants, sorted, each once.")
    start_at: datetime | None = Field(description="No fire before; for INTERVAL jobs, the anchor of the grid.")
    end_at: datetime | None = Field(description="No fire after.")
    max_runs: int | None = Field(description="The schedule starts at most this many runs.")
    jitter_sec: int
    overlap_policy: OverlapPolicy
    catchup_policy: CatchupPolicy
    catchup_window_sec: int
    target: TargetView
    payload: dict[str, Any]
    retry_policy: dict[str, Any] = Field(description="The retry policy as accepted, defaults filled in.")
    timeout_sec: int
    priority: Priority
    state: JobState = Field(
        description="ACTIVE; PAUSED (no fires until resumed); COMPLETED once its schedule is over (past `endAt`, "
        "`maxRuns` reached, last instant fired); CANCELLED."
    )
    next_fire_at: datetime | None = Field(
        description="When the next occurrence fires (jitter included); null once it will never fire again. "
        "In the past when the job is paused or its occurrence is being handled right now."
    )
    next_scheduled_for: datetime | None = Field(description="The next occurrence's nominal time (before jitter).")
    fire_count: int = Field(description="Runs the schedule has started (manual triggers and SKIPPED excluded).")
    missed_fires: int = Field(
        description="Occurrences that passed beyond the catch-up window without a run of their own."
    )
    version: int = Field(description="Grows by one on every change to the job; send it back in `If-Match`.")
    labels: dict[str, str] = Field(default_factory=dict)
    breaker: JobBreakerView | None = Field(None, description="The job's own breaker choice (null: the defaults).")
    created_at: datetime
    updated_at: datetime
    latest_execution_state: str | None = Field(
        None,
        description="The state of the job's latest execution (by scheduled time), beside the job's own `state`: a "
        "one-shot job is COMPLETED once it fired, while its execution may still be PENDING (no worker yet) or have "
        "FAILED. Null before its first execution; in lists and reads, not in a create's or change's answer.",
    )
    warnings: list[FieldError] | None = Field(
        None,
        description="Create and PATCH answers only, when something would keep the job from running as asked: no "
        "live worker reads its pool, or none of them serves its handler (`field`: `target.handler`). The job is "
        "stored all the same (workers may be deployed after it). Absent when there is nothing to say.",
    )


class Triggered(ViewModel):
    """A manual run, accepted: the dispatcher creates the execution within moments."""

    job_id: str
    execution_id: str = Field(
        description="The execution the run will be (`GET /v1/executions/{id}`): readable at once, PENDING until "
        "the dispatcher has created it."
    )
    scheduled_for: datetime


class Relative(ViewModel):
    """A parent or child of a job in the dependency graph."""

    job_id: str
    name: str
    state: JobState
    on: DependencyCondition = Field(description="The state the parent's execution must reach.")
    waiting: int | None = Field(
        None, description="Parents only: this parent's qualifying executions not consumed by a run of the job yet."
    )


class JobDetail(Job):
    latest_executions: list[Execution] = Field(description="The 10 most recent occurrences, newest first.")
    parents: list[Relative] = Field(description="The jobs this one runs after (DEPENDENT jobs).")
    children: list[Relative] = Field(description="The DEPENDENT jobs that run after this one (at most 100 listed).")


class JobList(ViewModel):
    items: list[Job] = Field(description="Newest job first.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")
