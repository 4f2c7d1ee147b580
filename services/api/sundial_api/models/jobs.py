"""Jobs: the job body (`POST /v1/jobs`), its patch, and the job views (`GET /v1/jobs/{id}`, trigger)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any
from uuid import UUID

from pydantic import ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationInfo, field_validator
from sundial_client.models.jobs import (
    Backoff,
    CatchupPolicy,
    DependencyCondition,
    Job,
    JobDetail,
    JobList,
    JobState,
    OverlapPolicy,
    Relative,
    TargetView,
    Triggered,
)
from sundial_common.broker.messages import POOL_NAME
from sundial_common.security.encryption import PAYLOAD, TenantCipher

from sundial_api.models.breakers import JobBreaker
from sundial_api.models.common import RequestModel
from sundial_api.models.executions import Priority
from sundial_api.models.schedules import JobType, ScheduleFields, recurring_only

HANDLER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$")
MAX_TIMEOUT_SEC = 7 * 24 * 3600
MAX_RETRY_DELAY_MS = 7 * 24 * 3600 * 1000
MAX_JITTER_SEC = 24 * 3600
MAX_CATCHUP_WINDOW_SEC = 366 * 24 * 3600
MAX_LABELS = 32
LABEL_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,62})$")
MAX_LABEL_VALUE = 255


def check_labels(value: Mapping[str, Any]) -> dict[str, str]:
    """A job's labels: at most 32, keys like `team` or `app.kubernetes.io/name`, string values up to 255."""
    if len(value) > MAX_LABELS:
        raise ValueError(f"has {len(value)} labels; at most {MAX_LABELS} are accepted")
    for key, item in value.items():
        if not isinstance(key, str) or not LABEL_KEY.match(key):
            raise ValueError(
                f"key `{key}` is not a label key: 1–63 letters, digits, `.`, `_`, `/` or `-`, starting with a "
                "letter or digit"
            )
        if not isinstance(item, str) or len(item) > MAX_LABEL_VALUE or "\x00" in item:
            raise ValueError(f"value of `{key}` must be a string of at most {MAX_LABEL_VALUE} characters")
    return dict(value)


JOB_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$")


def check_key(value: str) -> str:
    """A job key: 1–200 characters of letters, digits, ``._:/-`` starting with a letter or digit, not a UUID (so
    that a reference to a job, an id or a key, is never ambiguous)."""
    if not JOB_KEY.match(value):
        raise ValueError(
            f"`{value[:200]}` is not a job key: 1–200 letters, digits, `.`, `_`, `:`, `/` or `-`, starting with a "
            "letter or digit"
        )
    try:
        UUID(value)
    except ValueError:
        return value
    raise ValueError(f"`{value}` is a UUID: a key must not look like a job id")


class Dependency(RequestModel):
    """One parent of a DEPENDENT job, and the final state its execution must reach for the child to fire."""

    job_id: UUID = Field(description="The parent job: a job of the same tenant, not CANCELLED.")
    on: DependencyCondition = Field(
        DependencyCondition.SUCCEEDED,
        description="`SUCCEEDED`; `FAILED` (the parent's execution ended DEAD: failed with no attempts left); "
        "`ANY` final state (SUCCEEDED, DEAD or CANCELLED).",
    )


class Target(RequestModel):
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


class RetryPolicy(RequestModel):
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


class JobCreate(ScheduleFields):
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
    key: StrictStr | None = Field(
        None,
        description="Your own name for the job, unique per tenant: address it by key (`GET /v1/jobs:by-key/{key}`, "
        "`GET /v1/jobs?key=`). A create naming a key already registered answers that job (200) when the body is the "
        "same as the one that registered it, 409 naming the key and the job otherwise. 1–200 letters, digits, `.`, "
        "`_`, `:`, `/`, `-`, starting with a letter or digit; not a UUID. Set at creation only.",
        examples=["reports/nightly"],
    )
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
    priority: Priority = Field(
        Priority.NORMAL,
        description="Orders this tenant's work in its pool: when more is due than the pool's workers can start, "
        "HIGH starts before NORMAL before LOW (one start in ten still goes to the tenant's longest-waiting work). "
        "Never across tenants: it buys no share of a pool from another tenant. A PATCH applies from the next "
        "fire. See the priority guide.",
    )
    labels: dict[str, Any] = Field(
        default_factory=dict,
        description="String labels to find the job by (`GET /v1/jobs?label=team:growth`): at most 32, keys of "
        "1–63 letters, digits, `.`, `_`, `/`, `-`; values strings of at most 255 characters.",
        examples=[{"team": "growth", "campaign": "spring"}],
    )
    breaker: JobBreaker | None = Field(
        None,
        description="How the job meets its handler's retry circuit breaker (`GET /v1/breakers`): opt out of it, "
        "or hold first fires too while it is open. Absent: retries are held, first fires run as usual.",
    )
    depends_on: list[Dependency] | None = Field(
        None,
        description="DEPENDENT only, required: the parent jobs (1 to 10, same tenant) and the state each one's "
        "execution must reach. One parent: the job runs once per qualifying parent execution. Several: it runs "
        "once every parent has a new qualifying execution since its last run (a parent that ran twice "
        "meanwhile counts once). Chains are at most 10 jobs long; a cycle is refused. `catchupPolicy` and "
        "`catchupWindowSec` apply to triggers that waited longer than the window (the job was paused).",
    )

    @field_validator("depends_on")
    @classmethod
    def _depends_on_for_type(cls, value: list[Dependency] | None, info: ValidationInfo) -> list[Dependency] | None:
        job_type = info.data.get("type")
        if value is not None and job_type is not None and job_type is not JobType.DEPENDENT:
            raise ValueError(
                f"is only for DEPENDENT jobs: a {job_type} job fires on its clock, and one job cannot both follow a "
                "clock and wait for parents (create a DEPENDENT job after it instead)"
            )
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, Any]) -> dict[str, str]:
        return check_labels(value)

    @field_validator("key")
    @classmethod
    def _key(cls, value: str | None) -> str | None:
        return None if value is None else check_key(value)

    @field_validator("name")
    @classmethod
    def _storable(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("cannot contain the NUL character")
        return value

    @field_validator("overlap_policy", "catchup_policy", "catchup_window_sec")
    @classmethod
    def _policies_are_for_recurring_jobs(cls, value: Any, info: ValidationInfo) -> Any:
        if info.data.get("type") is JobType.DEPENDENT and info.field_name != "overlap_policy":
            return value  # a DEPENDENT job's late triggers follow its catch-up policy
        return recurring_only(value, info)


def _patch_field(description: str) -> Any:
    return Field(None, description=description, json_schema_extra={"nullable": True})


class JobPatch(RequestModel):
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
    labels: Any = _patch_field("As in the job body (the whole map; null clears every label).")
    breaker: Any = _patch_field("As in the job body (the whole object; null: the defaults).")
    depends_on: Any = _patch_field(
        "DEPENDENT jobs: the whole list of parents, checked as at creation (a cycle is refused with 422)."
    )


#: ``render_job``'s "open the stored payload" (any JSON value, ``None`` included, may be a payload).
SEALED: Any = object()


def render_job(row: Mapping[str, Any], cipher: TenantCipher, payload: Any = SEALED) -> dict[str, Any]:
    """A ``jobs`` row as the Job view: its payload opened with the tenant's ``cipher``, or ``payload`` when the
    caller has it in the clear (a create that just sealed it need not decrypt it again)."""
    return {
        "jobId": str(row["id"]),
        "key": row.get("key"),
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
        "payload": cipher.open_json(row["payload"], PAYLOAD) if payload is SEALED else payload,
        "retryPolicy": row["retry_policy"],
        "timeoutSec": row["timeout_sec"],
        "priority": row["priority"],
        "state": row["state"],
        "nextFireAt": row["next_fire_at"],
        "nextScheduledFor": row["next_nominal_at"] if row["next_fire_at"] is not None else None,
        "fireCount": row["fire_count"],
        "missedFires": row["missed_fires"],
        "version": row["version"],
        "labels": row["labels"],
        "breaker": row.get("breaker"),
        "latestExecutionState": row.get("latest_execution_state"),
        "createdAt": row["created_at"],
        "updatedAt": row["updated_at"],
    }
