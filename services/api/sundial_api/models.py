"""The API's documented shapes: the job request, the job / execution / attempt views, problem bodies.

Request models validate everything that can be checked without the clock or the database and name the
offending field in camelCase (``extra="forbid"``: an unknown field is an error, not silently dropped).
Response models document the views for OpenAPI; the handlers build the same shapes as plain dicts with
the ``render_*`` functions below (one pass over a database row, no model validation on the hot path),
and a unit test keeps the two in step.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
)
from pydantic.alias_generators import to_camel
from sundial_common.messages import POOL_NAME
from sundial_common.schedules import MAX_RUN_LIST, ScheduleError, parse_cron

from sundial_api.schedule import is_zone, parse_instant, suggest_zone

HANDLER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$")
MAX_DELAY_SECONDS = 10 * 365 * 24 * 3600  # ten years
MAX_TIMEOUT_SEC = 7 * 24 * 3600
MAX_RETRY_DELAY_MS = 7 * 24 * 3600 * 1000
MAX_INTERVAL_SEC = 10 * 365 * 24 * 3600
MAX_JITTER_SEC = 24 * 3600
MAX_CATCHUP_WINDOW_SEC = 366 * 24 * 3600
MAX_PREVIEW = 1000


class JobType(enum.StrEnum):
    ONE_SHOT = "ONE_SHOT"
    DELAYED = "DELAYED"
    CRON = "CRON"
    INTERVAL = "INTERVAL"
    RUN_LIST = "RUN_LIST"


RECURRING_TYPES = frozenset({JobType.CRON, JobType.INTERVAL, JobType.RUN_LIST})
#: Fields that say *when* a job fires; a PATCH touching any of them recomputes the next occurrence.
SCHEDULE_FIELDS = frozenset(
    {"type", "schedule", "timezone", "runAt", "delaySeconds", "intervalSec", "runList", "startAt", "endAt", "maxRuns"}
)
#: Fields only one job type takes.
TYPE_FIELDS = {
    JobType.ONE_SHOT: "runAt",
    JobType.DELAYED: "delaySeconds",
    JobType.CRON: "schedule",
    JobType.INTERVAL: "intervalSec",
    JobType.RUN_LIST: "runList",
}


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


class _Request(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", frozen=True)


def _instant(value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError("must be an RFC 3339 date-time string such as 2026-05-05T10:00:00Z")
    return parse_instant(value)


#: An RFC 3339 instant; without an offset it is wall-clock time in the job's ``timezone``.
Instant = Annotated[datetime, BeforeValidator(_instant)]
_T = TypeVar("_T")


class _View(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


# --- requests -------------------------------------------------------------------------------------


class Target(_Request):
    """Where an occurrence is delivered: a worker pool and a handler registered in it."""

    pool: StrictStr = Field(
        description="Worker pool name: lowercase letters, digits, `.`, `_`, `-`; at most 63 characters.",
        json_schema_extra={"pattern": POOL_NAME.pattern},
        examples=["email-sender"],
    )
    handler: StrictStr = Field(
        description="Handler name inside the pool: a letter or `_`, then letters, digits, `_ . : -`; "
        "at most 128 characters.",
        json_schema_extra={"pattern": HANDLER_NAME.pattern},
        examples=["send_welcome"],
    )

    @field_validator("pool")
    @classmethod
    def _pool_name(cls, value: str) -> str:
        if not POOL_NAME.match(value):
            raise ValueError(
                f"`{value}` is not a pool name: 1–63 characters of lowercase letters, digits, `.`, `_` or `-`, "
                "starting with a letter or digit"
            )
        return value

    @field_validator("handler")
    @classmethod
    def _handler_name(cls, value: str) -> str:
        if not HANDLER_NAME.match(value):
            raise ValueError(
                f"`{value}` is not a handler name: 1–128 characters of letters, digits, `_`, `.`, `:` or `-`, "
                "starting with a letter or `_`"
            )
        return value


class RetryPolicy(_Request):
    """How failed attempts are retried: after attempt n fails, the next starts `initialDelayMs` (FIXED),
    `initialDelayMs × n` (LINEAR) or `initialDelayMs × 2^(n−1)` (EXPONENTIAL) later, at most `maxDelayMs`; with
    `jitter`, a random delay between half that and all of it. After `maxAttempts` the execution is DEAD."""

    max_attempts: StrictInt = Field(3, ge=1, le=100, description="Attempts in total, the first included.")
    backoff: Backoff = Field(Backoff.EXPONENTIAL, description="How the delay grows between attempts.")
    initial_delay_ms: StrictInt = Field(
        30_000, ge=0, le=MAX_RETRY_DELAY_MS, description="Delay before the first retry, in milliseconds."
    )
    max_delay_ms: StrictInt = Field(
        3_600_000,
        ge=0,
        le=MAX_RETRY_DELAY_MS,
        validate_default=True,
        description="Upper bound of any retry delay, in milliseconds; at least `initialDelayMs`.",
    )
    jitter: StrictBool = Field(True, description="Randomize each delay (avoids synchronized retries).")

    @field_validator("max_delay_ms")
    @classmethod
    def _not_below_initial(cls, value: int, info: ValidationInfo) -> int:
        initial = info.data.get("initial_delay_ms")
        if initial is not None and value < initial:
            raise ValueError(f"must be at least initialDelayMs ({initial})")
        return value


class _ScheduleFields(_Request):
    """When a job fires: its type and the fields of that type, its time zone and bounds."""

    type: JobType = Field(
        description="`ONE_SHOT` (once at `runAt`), `DELAYED` (once, `delaySeconds` from now), `CRON` (on "
        "`schedule` in `timezone`), `INTERVAL` (every `intervalSec` from `startAt`) or `RUN_LIST` (at each "
        "instant of `runList`)."
    )
    # Declared right after type: validators of later fields read both from ``info.data``.
    timezone: StrictStr = Field(
        "UTC",
        description="IANA time zone of the schedule: a `CRON` expression is evaluated on its wall clock, and "
        "instants written without an offset are read in it.",
        examples=["Europe/Paris"],
    )
    run_at: Instant | None = Field(
        None,
        validate_default=True,
        description="ONE_SHOT only, required: RFC 3339 instant. Without an offset it is a wall-clock time in "
        "`timezone` (a time skipped by a DST change means the end of the gap; a repeated one, the first). "
        "Stored at millisecond precision. Up to the server's grace period (60 s) in the past fires at once; "
        "further in the past is refused.",
    )
    delay_seconds: Annotated[StrictInt, Field(ge=0, le=MAX_DELAY_SECONDS)] | None = Field(
        None, validate_default=True, description="DELAYED only, required: seconds from now (0 to ten years)."
    )
    schedule: StrictStr | None = Field(
        None,
        validate_default=True,
        description="CRON only, required: 5 fields (`minute hour day month weekday`) or 6 with seconds first "
        "(`second minute hour day month weekday`), or `@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`. "
        "Evaluated in `timezone`. Across DST changes a fixed hour (`30 2 * * *`) fires once a day — at the end "
        "of a skipped hour, at the first of a repeated one — while a wildcard or stepped hour (`0 * * * *`, "
        "`0 */2 * * *`) follows real time. When day of month and day of week are both restricted (neither "
        "starts with `*`), a day matching either fires; `L` (last day), `5L` (last Friday) and `1#2` (second "
        "Monday) are understood.",
        examples=["30 2 * * *", "*/15 * * * *", "*/2 * * * * *"],
    )
    interval_sec: Annotated[StrictInt, Field(ge=1, le=MAX_INTERVAL_SEC)] | None = Field(
        None,
        validate_default=True,
        description="INTERVAL only, required: seconds between fires (at least the server's minimum, 1 s by "
        "default). Fires at `startAt + k × intervalSec`, so a late fire never shifts the next ones.",
    )
    run_list: Annotated[list[Instant], Field(min_length=1, max_length=MAX_RUN_LIST)] | None = Field(
        None,
        validate_default=True,
        description="RUN_LIST only, required: the instants to fire at (1 to 1000, RFC 3339, any order; "
        "duplicates fire once). Each may be up to the grace period in the past (fires at once).",
    )
    start_at: Instant | None = Field(
        None,
        description="Recurring jobs: no fire before this instant. INTERVAL jobs are anchored here; without it, "
        "at creation time plus one interval.",
    )
    end_at: Instant | None = Field(
        None, description="Recurring jobs: no fire after this instant; the job is COMPLETED once past it."
    )
    max_runs: Annotated[StrictInt, Field(ge=1)] | None = Field(
        None, description="Recurring jobs: the schedule starts at most this many runs, then the job is COMPLETED."
    )

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        if not is_zone(value):
            hint = suggest_zone(value)
            raise ValueError(
                f"unknown time zone `{value}`"
                + (f"; did you mean `{hint}`?" if hint else "; use an IANA name such as `Europe/Paris`")
            )
        return value

    @field_validator("run_at")
    @classmethod
    def _run_at_for_type(cls, value: datetime | None, info: ValidationInfo) -> datetime | None:
        job_type = info.data.get("type")
        if job_type is JobType.DELAYED and value is not None:
            raise ValueError("is not allowed for DELAYED jobs; they take delaySeconds")
        return _only_for(JobType.ONE_SHOT, value, info)

    @field_validator("delay_seconds")
    @classmethod
    def _delay_for_type(cls, value: int | None, info: ValidationInfo) -> int | None:
        if info.data.get("type") is JobType.ONE_SHOT and value is not None:
            raise ValueError("is not allowed for ONE_SHOT jobs; they take runAt")
        return _only_for(JobType.DELAYED, value, info)

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str | None, info: ValidationInfo) -> str | None:
        _only_for(JobType.CRON, value, info)
        if value is not None and info.data.get("type") is JobType.CRON:
            try:
                parse_cron(value)
            except ScheduleError as exc:
                raise ValueError(exc.message) from None
        return value

    @field_validator("interval_sec")
    @classmethod
    def _interval_for_type(cls, value: int | None, info: ValidationInfo) -> int | None:
        return _only_for(JobType.INTERVAL, value, info)

    @field_validator("run_list")
    @classmethod
    def _run_list_for_type(cls, value: list[datetime] | None, info: ValidationInfo) -> list[datetime] | None:
        return _only_for(JobType.RUN_LIST, value, info)

    @field_validator("start_at", "end_at", "max_runs")
    @classmethod
    def _bounds_are_for_recurring_jobs(cls, value: Any, info: ValidationInfo) -> Any:
        return _recurring_only(value, info)


def _only_for(job_type: JobType, value: _T, info: ValidationInfo) -> _T:
    """A type-specific field: required for ``job_type``, refused for the others (naming what they take)."""
    actual = info.data.get("type")
    if actual is None:  # the type itself was invalid: that error is enough
        return value
    if actual is job_type and value is None:
        raise ValueError(f"is required for {job_type} jobs")
    if actual is not job_type and value is not None:
        raise ValueError(f"is only for {job_type} jobs; {actual} jobs take {TYPE_FIELDS[actual]}")
    return value


def _recurring_only(value: _T, info: ValidationInfo) -> _T:
    job_type = info.data.get("type")
    if value is not None and job_type is not None and job_type not in RECURRING_TYPES:
        raise ValueError(f"is only for CRON, INTERVAL and RUN_LIST jobs, not {job_type}")
    return value


class JobCreate(_ScheduleFields):
    """A job to register: when it fires (`type` and its fields), where it runs (`target`), with what (`payload`)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "name": "welcome-email",
                    "type": "ONE_SHOT",
                    "runAt": "2026-05-05T10:00:00Z",
                    "target": {"pool": "email-sender", "handler": "send_welcome"},
                    "payload": {"userId": 42},
                },
                {
                    "name": "nightly-report",
                    "type": "CRON",
                    "schedule": "30 2 * * *",
                    "timezone": "America/New_York",
                    "jitterSec": 60,
                    "overlapPolicy": "SKIP",
                    "target": {"pool": "reports", "handler": "nightly"},
                },
                {
                    "name": "poll",
                    "type": "INTERVAL",
                    "intervalSec": 300,
                    "startAt": "2026-05-05T10:00:00Z",
                    "endAt": "2026-06-05T10:00:00Z",
                    "target": {"pool": "demo", "handler": "echo"},
                    "retryPolicy": {"maxAttempts": 5, "backoff": "EXPONENTIAL", "initialDelayMs": 1000},
                },
            ]
        }
    )

    name: StrictStr = Field(min_length=1, max_length=200, description="A label for people; not unique.")
    jitter_sec: Annotated[StrictInt, Field(ge=0, le=MAX_JITTER_SEC)] = Field(
        0,
        description="Delay each fire by up to this many seconds, to spread load. The delay is derived from the "
        "job id and the occurrence, so it never changes for a given occurrence (restarts move nothing); the "
        "execution keeps both `scheduledFor` (nominal) and `fireAt` (actual).",
    )
    overlap_policy: OverlapPolicy = Field(
        OverlapPolicy.ALLOW,
        description="Recurring jobs: what a fire does while the previous execution is still PENDING or RUNNING. "
        "`ALLOW` runs anyway; `SKIP` records a SKIPPED execution; `BUFFER_ONE` runs it once the previous one "
        "ends (fires meanwhile are SKIPPED); `CANCEL_RUNNING` cancels the previous one and runs.",
    )
    catchup_policy: CatchupPolicy = Field(
        CatchupPolicy.FIRE_ONCE,
        description="Recurring jobs: what happens to fires missed by more than `catchupWindowSec` (Sundial was "
        "down, or the job was paused): `FIRE_ONCE` runs one for all of them, `FIRE_ALL` runs each (up to a "
        "cap), `SKIP` runs none. Missed fires without a run of their own are counted in `missedFires`.",
    )
    catchup_window_sec: Annotated[StrictInt, Field(ge=1, le=MAX_CATCHUP_WINDOW_SEC)] = Field(
        60, description="Recurring jobs: a fire at most this late still runs as usual; later, it was missed."
    )
    target: Target
    payload: dict[str, Any] = Field(
        default_factory=dict,
        description="Any JSON object, handed to the handler as is; at most 256 KiB as compact JSON (else 413).",
    )
    retry_policy: RetryPolicy = Field(default_factory=RetryPolicy)
    timeout_sec: Annotated[StrictInt, Field(ge=1, le=MAX_TIMEOUT_SEC)] | None = Field(
        None, description="Seconds one attempt may run (1 to 7 days). Default: the server's (600)."
    )
    priority: Priority = Field(Priority.NORMAL, description="Dispatch priority within the pool.")

    @field_validator("name")
    @classmethod
    def _storable(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("cannot contain the NUL character")
        return value

    @field_validator("overlap_policy", "catchup_policy", "catchup_window_sec")
    @classmethod
    def _policies_are_for_recurring_jobs(cls, value: Any, info: ValidationInfo) -> Any:
        return _recurring_only(value, info)


def _patch_field(description: str) -> Any:
    return Field(None, description=description, json_schema_extra={"nullable": True})


class JobPatch(_Request):
    """Changes to a job: any field of the job body; the fields left out keep their values, `null` clears one.

    The job as changed is validated like a new one (422 naming the field; nothing written). A change to
    when it fires (`type`, `schedule`, `timezone`, `runAt`, `delaySeconds`, `intervalSec`, `runList`,
    `startAt`, `endAt`, `maxRuns`) applies from the next occurrence after now; executions already
    dispatched continue. Changing `type` drops the old type's own field (`schedule`, `runAt`, …).
    """

    name: Any = _patch_field("As in the job body.")
    type: Any = _patch_field("As in the job body.")
    timezone: Any = _patch_field("As in the job body.")
    run_at: Any = _patch_field("As in the job body.")
    delay_seconds: Any = _patch_field("As in the job body (counted from now).")
    schedule: Any = _patch_field("As in the job body.")
    interval_sec: Any = _patch_field("As in the job body.")
    run_list: Any = _patch_field("As in the job body.")
    start_at: Any = _patch_field("As in the job body.")
    end_at: Any = _patch_field("As in the job body.")
    max_runs: Any = _patch_field("As in the job body; runs already started count.")
    jitter_sec: Any = _patch_field("As in the job body; applies to the next occurrence too.")
    overlap_policy: Any = _patch_field("As in the job body.")
    catchup_policy: Any = _patch_field("As in the job body.")
    catchup_window_sec: Any = _patch_field("As in the job body.")
    target: Any = _patch_field("As in the job body (the whole object).")
    payload: Any = _patch_field("As in the job body (the whole object).")
    retry_policy: Any = _patch_field("As in the job body (the whole object).")
    timeout_sec: Any = _patch_field("As in the job body.")
    priority: Any = _patch_field("As in the job body.")


class SchedulePreviewRequest(_ScheduleFields):
    """A schedule to try out before trusting it: the schedule fields of a job body, and how many fires to list."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"type": "CRON", "schedule": "30 2 * * *", "timezone": "America/New_York"}]}
    )

    count: Annotated[StrictInt, Field(ge=1, le=MAX_PREVIEW)] = Field(10, description="How many fires to list (1–1000).")


# --- views ----------------------------------------------------------------------------------------


class TargetView(_View):
    pool: str
    handler: str


class Job(_View):
    """A job as stored. Instants are RFC 3339 UTC (`Z`)."""

    job_id: str = Field(description="UUIDv7.")
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
    created_at: datetime
    updated_at: datetime


class Fire(_View):
    """One upcoming fire of a schedule."""

    scheduled_for: datetime = Field(description="The occurrence's nominal instant, UTC.")
    fire_at: datetime = Field(description="When it fires: `scheduledFor` plus the job's jitter, UTC.")
    local: str = Field(description="`scheduledFor` on the wall clock of the schedule's zone, with its offset.")


class Preview(_View):
    timezone: str
    fires: list[Fire] = Field(description="The next fires, soonest first; fewer than asked if the schedule ends.")


class Triggered(_View):
    """A manual run, accepted: the dispatcher creates the execution within moments."""

    job_id: str
    execution_id: str = Field(description="The execution the run will be (`GET /v1/executions/{id}`).")
    scheduled_for: datetime


class Execution(_View):
    """One occurrence of a job and its current attempt."""

    execution_id: str
    job_id: str
    scheduled_for: datetime = Field(description="The occurrence's nominal time (unique per job).")
    fire_at: datetime | None = Field(description="When it was due to fire: `scheduledFor` plus the job's jitter.")
    triggered: bool = Field(description="A manual run (`POST /v1/jobs/{id}/trigger`), outside the schedule.")
    cancel_requested_at: datetime | None = Field(description="When it was asked to stop (e.g. CANCEL_RUNNING).")
    state: ExecutionState
    attempt: int = Field(description="The current attempt, from 1.")
    max_attempts: int
    next_attempt_at: datetime | None = Field(
        None, description="While a retry is scheduled (after a failed attempt with attempts left): when it is due."
    )
    shard: int
    fence_token: int = Field(description="Leadership token of the dispatcher that created it (for dedupe).")
    pool: str
    handler: str
    worker_id: str | None
    created_at: datetime
    published_at: datetime | None = Field(description="When it was handed to the broker.")
    started_at: datetime | None
    finished_at: datetime | None
    result: Any = Field(description="What the handler returned (JSON), once SUCCEEDED.")
    error: str | None
    trace_id: str | None = Field(description="OpenTelemetry trace id: the request, dispatch and run are one trace.")
    trace_link: str | None = Field(description="Where to look the trace up (Jaeger).")


class Attempt(_View):
    attempt: int
    worker_id: str
    state: str
    started_at: datetime
    finished_at: datetime | None
    error: str | None
    progress: Any = Field(description="The last progress the handler reported by heartbeat.")


class JobDetail(Job):
    latest_executions: list[Execution] = Field(description="The 10 most recent occurrences, newest first.")


class ExecutionDetail(Execution):
    attempts: list[Attempt] = Field(description="Every attempt, oldest first.")


class ExecutionPage(_View):
    items: list[Execution] = Field(description="Newest occurrence first.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")


class FieldError(_View):
    field: str = Field(description="Dotted camelCase path of the offending input, e.g. `target.pool`.")
    message: str


class Problem(_View):
    """An RFC 9457 problem document (`application/problem+json`)."""

    type: str
    title: str
    status: int
    detail: str
    errors: list[FieldError] = Field(default_factory=list)


class Health(_View):
    status: str


class Readiness(_View):
    status: str
    checks: dict[str, str] = Field(description="Per dependency: `ok` or what went wrong.")


# --- rendering rows -------------------------------------------------------------------------------


def render_job(row: Mapping[str, Any]) -> dict[str, Any]:
    """A ``jobs`` row as the Job view."""
    return {
        "jobId": str(row["id"]),
        "name": row["name"],
        "type": row["type"],
        "timezone": row["timezone"],
        "runAt": row["run_at"],
        "delaySeconds": row["delay_seconds"],
        "schedule": row["schedule"],
        "intervalSec": row["interval_sec"],
        "runList": row["run_list"],
        "startAt": row["start_at"],
        "endAt": row["end_at"],
        "maxRuns": row["max_runs"],
        "jitterSec": row["jitter_sec"],
        "overlapPolicy": row["overlap_policy"],
        "catchupPolicy": row["catchup_policy"],
        "catchupWindowSec": row["catchup_window_sec"],
        "target": {"pool": row["pool"], "handler": row["handler"]},
        "payload": row["payload"],
        "retryPolicy": row["retry_policy"],
        "timeoutSec": row["timeout_sec"],
        "priority": row["priority"],
        "state": row["state"],
        "nextFireAt": row["next_fire_at"],
        "nextScheduledFor": row["next_nominal_at"] if row["next_fire_at"] is not None else None,
        "fireCount": row["fire_count"],
        "missedFires": row["missed_fires"],
        "version": row["version"],
        "createdAt": row["created_at"],
        "updatedAt": row["updated_at"],
    }


def render_execution(row: Mapping[str, Any], trace_link_template: str) -> dict[str, Any]:
    """An ``executions`` row as the Execution view."""
    trace_id = row["trace_id"]
    return {
        "executionId": str(row["id"]),
        "jobId": str(row["job_id"]),
        "scheduledFor": row["scheduled_for"],
        "fireAt": row["fire_at"],
        "triggered": row["triggered"],
        "cancelRequestedAt": row["cancel_requested_at"],
        "state": row["state"],
        "attempt": row["attempt"],
        "maxAttempts": row["max_attempts"],
        "nextAttemptAt": row.get("next_attempt_at"),
        "shard": row["shard"],
        "fenceToken": row["fence_token"],
        "pool": row["pool"],
        "handler": row["handler"],
        "workerId": row["worker_id"],
        "createdAt": row["created_at"],
        "publishedAt": row["published_at"],
        "startedAt": row["started_at"],
        "finishedAt": row["finished_at"],
        "result": row["result"],
        "error": row["error"],
        "traceId": trace_id,
        "traceLink": trace_link_template.format(trace_id=trace_id) if trace_id else None,
    }


def render_attempt(row: Mapping[str, Any]) -> dict[str, Any]:
    """An ``execution_attempts`` row as the Attempt view."""
    return {
        "attempt": row["attempt"],
        "workerId": row["worker_id"],
        "state": row["state"],
        "startedAt": row["started_at"],
        "finishedAt": row["finished_at"],
        "error": row["error"],
        "progress": row["progress"],
    }


class ExecutionList(_View):
    items: list[Execution] = Field(description="Newest first.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")
