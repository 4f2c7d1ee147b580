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
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationInfo, field_validator
from pydantic.alias_generators import to_camel
from sundial_common.messages import POOL_NAME

from sundial_api.schedule import is_zone, parse_instant, suggest_zone

HANDLER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$")
MAX_DELAY_SECONDS = 10 * 365 * 24 * 3600  # ten years
MAX_TIMEOUT_SEC = 7 * 24 * 3600
MAX_RETRY_DELAY_MS = 7 * 24 * 3600 * 1000


class JobType(enum.StrEnum):
    ONE_SHOT = "ONE_SHOT"
    DELAYED = "DELAYED"
    CRON = "CRON"
    INTERVAL = "INTERVAL"
    RUN_LIST = "RUN_LIST"


SUPPORTED_TYPES = frozenset({JobType.ONE_SHOT, JobType.DELAYED})


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
    """How failed attempts are retried. Stored with the job (retries arrive in a later release)."""

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


class JobCreate(_Request):
    """A job to register. `ONE_SHOT` fires once at `runAt`; `DELAYED` fires once `delaySeconds` from now."""

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
                    "name": "reminder",
                    "type": "DELAYED",
                    "delaySeconds": 3600,
                    "target": {"pool": "demo", "handler": "echo"},
                    "retryPolicy": {"maxAttempts": 5, "backoff": "EXPONENTIAL", "initialDelayMs": 1000},
                    "priority": "HIGH",
                },
            ]
        }
    )

    name: StrictStr = Field(min_length=1, max_length=200, description="A label for people; not unique.")
    type: JobType = Field(
        description="`ONE_SHOT` or `DELAYED`. `CRON`, `INTERVAL` and `RUN_LIST` are reserved and not supported yet."
    )
    # Declared before runAt: validators of later fields read it from ``info.data``.
    timezone: StrictStr = Field(
        "UTC", description="IANA time zone in which a `runAt` without an offset is read.", examples=["Europe/Paris"]
    )
    run_at: datetime | None = Field(
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

    @field_validator("type")
    @classmethod
    def _supported(cls, value: JobType) -> JobType:
        if value not in SUPPORTED_TYPES:
            raise ValueError(f"{value} jobs are not supported yet; use ONE_SHOT or DELAYED")
        return value

    @field_validator("name")
    @classmethod
    def _storable(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("cannot contain the NUL character")
        return value

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

    @field_validator("run_at", mode="before")
    @classmethod
    def _rfc3339(cls, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, str):
            raise ValueError("must be an RFC 3339 date-time string such as 2026-05-05T10:00:00Z")
        return parse_instant(value)

    @field_validator("run_at")
    @classmethod
    def _run_at_for_type(cls, value: datetime | None, info: ValidationInfo) -> datetime | None:
        job_type = info.data.get("type")
        if job_type is JobType.ONE_SHOT and value is None:
            raise ValueError("is required for ONE_SHOT jobs")
        if job_type is JobType.DELAYED and value is not None:
            raise ValueError("is not allowed for DELAYED jobs; they take delaySeconds")
        return value

    @field_validator("delay_seconds")
    @classmethod
    def _delay_for_type(cls, value: int | None, info: ValidationInfo) -> int | None:
        job_type = info.data.get("type")
        if job_type is JobType.DELAYED and value is None:
            raise ValueError("is required for DELAYED jobs")
        if job_type is JobType.ONE_SHOT and value is not None:
            raise ValueError("is not allowed for ONE_SHOT jobs; they take runAt")
        return value


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
    target: TargetView
    payload: dict[str, Any]
    retry_policy: dict[str, Any] = Field(description="The retry policy as accepted, defaults filled in.")
    timeout_sec: int
    priority: Priority
    state: JobState = Field(description="ACTIVE until it fired for the last time (COMPLETED) or was cancelled.")
    next_fire_at: datetime | None = Field(description="The next occurrence; null once it will never fire again.")
    fire_count: int = Field(description="Occurrences dispatched so far.")
    version: int = Field(description="Grows by one on every change to the job.")
    created_at: datetime
    updated_at: datetime


class Execution(_View):
    """One occurrence of a job and its current attempt."""

    execution_id: str
    job_id: str
    scheduled_for: datetime = Field(description="The occurrence's due time.")
    state: ExecutionState
    attempt: int = Field(description="The current attempt, from 1.")
    max_attempts: int
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
        "target": {"pool": row["pool"], "handler": row["handler"]},
        "payload": row["payload"],
        "retryPolicy": row["retry_policy"],
        "timeoutSec": row["timeout_sec"],
        "priority": row["priority"],
        "state": row["state"],
        "nextFireAt": row["next_fire_at"],
        "fireCount": row["fire_count"],
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
        "state": row["state"],
        "attempt": row["attempt"],
        "maxAttempts": row["max_attempts"],
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
