"""The API's shapes as the client reads and writes them: jobs, executions, attempts, previews, problems.

Fields are snake_case in Python and camelCase on the wire (``next_fire_at`` ↔ ``nextFireAt``). Response
models ignore fields they do not know, so an older client keeps working against a newer server; the
test ``tests/unit/test_client_models.py`` compares every model here with the server's OpenAPI document
(field names, required-ness, enum values) and fails when the two drift apart.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class JobType(enum.StrEnum):
    ONE_SHOT = "ONE_SHOT"
    DELAYED = "DELAYED"
    CRON = "CRON"
    INTERVAL = "INTERVAL"
    RUN_LIST = "RUN_LIST"
    #: No clock: runs after its parents (``dependsOn``).
    DEPENDENT = "DEPENDENT"


class JobState(enum.StrEnum):
    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"


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


class OverlapPolicy(enum.StrEnum):
    ALLOW = "ALLOW"
    SKIP = "SKIP"
    BUFFER_ONE = "BUFFER_ONE"
    CANCEL_RUNNING = "CANCEL_RUNNING"


class CatchupPolicy(enum.StrEnum):
    FIRE_ONCE = "FIRE_ONCE"
    FIRE_ALL = "FIRE_ALL"
    SKIP = "SKIP"


class Priority(enum.StrEnum):
    LOW = "LOW"
    NORMAL = "NORMAL"
    HIGH = "HIGH"


class Backoff(enum.StrEnum):
    FIXED = "FIXED"
    LINEAR = "LINEAR"
    EXPONENTIAL = "EXPONENTIAL"


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class _Body(BaseModel):
    """A request body: unset (None) fields are left out, so the server applies its defaults."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        return wire


# --- requests -------------------------------------------------------------------------------------


class Target(_Body):
    """Where an occurrence is delivered: a worker pool and a handler registered in it."""

    pool: str
    handler: str


class RetryPolicy(_Body):
    max_attempts: int | None = None
    backoff: Backoff | None = None
    initial_delay_ms: int | None = None
    max_delay_ms: int | None = None
    jitter: bool | None = None


class _ScheduleFields(_Body):
    type: JobType
    timezone: str | None = None
    run_at: datetime | None = None
    delay_seconds: int | None = None
    schedule: str | None = None
    interval_sec: int | None = None
    run_list: list[datetime] | None = None
    start_at: datetime | None = None
    end_at: datetime | None = None
    max_runs: int | None = None


class Dependency(_Body):
    """A parent of a DEPENDENT job, and the final state its execution must reach (SUCCEEDED, FAILED or ANY)."""

    job_id: str
    on: str | None = None


class NewJob(_ScheduleFields):
    """A job to register (``POST /v1/jobs``): `type` and its own field say when, `target` where."""

    name: str
    target: Target
    payload: dict[str, Any] | None = None
    jitter_sec: int | None = None
    overlap_policy: OverlapPolicy | None = None
    catchup_policy: CatchupPolicy | None = None
    catchup_window_sec: int | None = None
    retry_policy: RetryPolicy | None = None
    timeout_sec: int | None = None
    priority: Priority | None = None
    labels: dict[str, str] | None = None
    #: ``{"enabled": bool, "firstFires": "RUN" | "HOLD"}``: how the job meets its handler's circuit breaker.
    breaker: dict[str, Any] | None = None
    depends_on: list[Dependency] | None = None


class SchedulePreviewRequest(_ScheduleFields):
    """A schedule to try (``POST /v1/schedules:preview``) and how many fires to list."""

    count: int | None = None


# --- views ----------------------------------------------------------------------------------------


class TargetView(_Wire):
    pool: str
    handler: str


class Job(_Wire):
    job_id: str
    name: str
    type: JobType
    timezone: str
    run_at: datetime | None
    delay_seconds: int | None
    schedule: str | None
    interval_sec: int | None
    run_list: list[datetime] | None
    start_at: datetime | None
    end_at: datetime | None
    max_runs: int | None
    jitter_sec: int
    overlap_policy: OverlapPolicy
    catchup_policy: CatchupPolicy
    catchup_window_sec: int
    target: TargetView
    payload: dict[str, Any]
    retry_policy: dict[str, Any]
    timeout_sec: int
    priority: Priority
    state: JobState
    next_fire_at: datetime | None
    next_scheduled_for: datetime | None
    fire_count: int
    missed_fires: int
    version: int
    labels: dict[str, str] = Field(default_factory=dict)
    breaker: dict[str, Any] | None = None
    created_at: datetime
    updated_at: datetime


class Execution(_Wire):
    execution_id: str
    job_id: str
    scheduled_for: datetime
    fire_at: datetime | None
    triggered: bool
    #: A DEPENDENT job's run: the parent executions it ran after.
    caused_by: list[str] | None = None
    cancel_requested_at: datetime | None
    state: ExecutionState
    attempt: int
    max_attempts: int
    next_attempt_at: datetime | None = None
    #: The retry circuit breaker holding this retry (``GET /v1/breakers/{id}``); None when none holds it.
    held_by: str | None = None
    shard: int
    fence_token: int
    pool: str
    handler: str
    #: The job's priority when this execution was dispatched (a later PATCH changes the next fires only).
    priority: Priority = Priority.NORMAL
    worker_id: str | None
    created_at: datetime
    published_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    result: Any
    error: str | None
    trace_id: str | None
    trace_link: str | None

    @property
    def ended(self) -> bool:
        """Nothing more will happen to it by itself: not pending or running, and no retry scheduled."""
        return self.state not in (ExecutionState.PENDING, ExecutionState.RUNNING) and self.next_attempt_at is None


class Attempt(_Wire):
    attempt: int
    worker_id: str
    state: str
    started_at: datetime
    finished_at: datetime | None
    error: str | None
    progress: Any


class Relative(_Wire):
    """A parent or a child of a job in the dependency graph."""

    job_id: str
    name: str
    state: JobState
    on: str
    waiting: int | None = None


class JobDetail(Job):
    latest_executions: list[Execution]
    parents: list[Relative] = Field(default_factory=list)
    children: list[Relative] = Field(default_factory=list)


class BackfillRequest(_Body):
    """``POST /v1/jobs/{id}:backfill``: the past range ``[from, to)`` of a recurring job to run."""

    range_from: datetime = Field(alias="from")
    range_to: datetime = Field(alias="to")
    overlap_policy: str | None = None
    rate_per_sec: float | None = None
    dry_run: bool | None = None


class Backfill(_Wire):
    backfill_id: str
    job_id: str
    range_from: datetime = Field(alias="from")
    range_to: datetime = Field(alias="to")
    overlap_policy: str
    rate_per_sec: float
    state: str
    total: int
    created: int
    finished: int
    cursor: datetime | None
    created_at: datetime
    finished_at: datetime | None


class BackfillDryRun(_Wire):
    count: int
    first: list[datetime]


class ExecutionDetail(Execution):
    attempts: list[Attempt]


class JobList(_Wire):
    items: list[Job]
    next_cursor: str | None


class ExecutionPage(_Wire):
    items: list[Execution]
    next_cursor: str | None


class AuditEntry(_Wire):
    """One change of a job or an execution: what, the state before and after, who (token subject), when."""

    at: datetime
    action: str
    from_state: str | None = None
    to_state: str | None = None
    actor: str
    detail: dict[str, Any] | None = None


class AuditPage(_Wire):
    items: list[AuditEntry]
    next_cursor: str | None


class Fire(_Wire):
    scheduled_for: datetime
    fire_at: datetime
    local: str


class Preview(_Wire):
    timezone: str
    fires: list[Fire]


class Triggered(_Wire):
    job_id: str
    execution_id: str
    scheduled_for: datetime


class FieldError(_Wire):
    field: str
    message: str


class Problem(_Wire):
    """An RFC 9457 problem document, as every API error is."""

    type: str
    title: str
    status: int
    detail: str
    errors: list[FieldError] = Field(default_factory=list)


class BatchItem(_Wire):
    """One item of a batch create: 201 with its `job`, or a 4xx with its `problem`."""

    index: int
    status: int
    job: Job | None = None
    problem: Problem | None = None


class BatchResult(_Wire):
    created: int
    failed: int
    results: list[BatchItem]


class ReplicaView(_Wire):
    id: str
    kind: str
    host: str
    pid: int
    started_at: str
    last_heartbeat_at: str
    leads_shards: list[int]
    roles: list[str]


class ShardView(_Wire):
    shard: int
    leader: str | None
    fence_token: int | None
    recorded_fence: int | None
    lease_ttl_sec: int | None
    hot_window_size: int | None
    handover_to: str | None


class RoleView(_Wire):
    role: str
    leader: str | None
    fence_token: int | None
    lease_ttl_sec: int | None


class ClusterView(_Wire):
    generated_at: str
    shard_count: int
    replicas: list[ReplicaView]
    shards: list[ShardView]
    roles: list[RoleView]
    errors: dict[str, str]


# --- stats (GET /v1/stats/…, from the ClickHouse replica) -------------------------------------------


class Percentiles(_Wire):
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None


class ExecutionStatsItem(_Wire):
    start: datetime
    group: str | None
    executions: int
    succeeded: int
    failed: int
    open: int
    failure_rate: float | None
    lateness_ms: Percentiles
    duration_ms: Percentiles


class ExecutionStats(_Wire):
    from_: datetime = Field(alias="from")
    to: datetime
    interval: str
    group_by: str | None
    items: list[ExecutionStatsItem]


class HandlerStats(_Wire):
    pool: str
    handler: str
    executions: int
    succeeded: int
    failed: int
    failure_rate: float | None
    duration_ms: Percentiles
    top_error_class: str | None


class HandlerRanking(_Wire):
    from_: datetime = Field(alias="from")
    to: datetime
    slowest: list[HandlerStats]
    most_failing: list[HandlerStats]


class Quotas(_Wire):
    """A tenant's limits; None is unlimited."""

    max_active_jobs: int | None = None
    max_creates_per_sec: float | None = None
    max_concurrent_executions: int | None = None
    max_dispatch_per_sec: float | None = None


class Tenant(_Wire):
    """A registered tenant (`/v1/admin/tenants`)."""

    id: str
    display_name: str | None
    weight: int
    quotas: Quotas
    default_jitter_sec: int
    #: The tenant's own retry circuit breaker settings (None: the service defaults).
    breaker: dict[str, Any] | None = None
    state: str
    version: int
    created_at: datetime | None
    updated_at: datetime | None


class TenantList(_Wire):
    items: list[Tenant]
    next_cursor: str | None


class Pool(_Wire):
    """A registered pool (`/v1/admin/pools`, `GET /v1/pools`): who may send work into it, its kind, its defaults."""

    name: str
    owner: str | None
    shared_with: list[str]
    kind: str
    partitions: int | None
    retention_ms: int | None
    default_timeout_sec: int | None
    default_retry_policy: dict[str, Any] | None
    version: int
    created_at: datetime | None
    updated_at: datetime | None


class PoolList(_Wire):
    items: list[Pool]
    next_cursor: str | None


class Breaker(_Wire):
    """A handler's retry circuit breaker (``GET /v1/breakers``): CLOSED, OPEN (retries held) or HALF_OPEN."""

    id: str
    pool: str
    handler: str
    state: str
    failure_ratio: float | None
    attempts: int
    failures: int
    held: int
    opened_at: datetime | None
    next_probe_at: datetime | None
    cooldown_sec: float
    probes_sent: int
    opens: int
    manual: bool
    updated_at: datetime


class BreakerList(_Wire):
    items: list[Breaker]
