"""When a job fires: job types, the schedule fields a job body and a schedule preview share, the preview views.

Every type-specific field is required for its type and refused, naming what the type takes instead, for the
others; bounds (`startAt`, `endAt`, `maxRuns`) are for recurring types only.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, TypeVar

from pydantic import ConfigDict, Field, StrictInt, StrictStr, ValidationInfo, field_validator
from sundial_client.models.schedules import Fire, JobType, Preview
from sundial_common.domain.schedules import MAX_RUN_LIST, ScheduleError, parse_cron

from sundial_api.models.common import Instant, RequestModel
from sundial_api.schedule import is_zone, suggest_zone

MAX_DELAY_SECONDS = 10 * 365 * 24 * 3600  # ten years
MAX_INTERVAL_SEC = 10 * 365 * 24 * 3600
MAX_PREVIEW = 1000
_T = TypeVar("_T")


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
    JobType.DEPENDENT: "dependsOn",
}


class ScheduleFields(RequestModel):
    """When a job fires: its type and the fields of that type, its time zone and bounds."""

    type: JobType = Field(
        description="`ONE_SHOT` (once at `runAt`), `DELAYED` (once, `delaySeconds` from now), `CRON` (on "
        "`schedule` in `timezone`), `INTERVAL` (every `intervalSec` from `startAt`), `RUN_LIST` (at each "
        "instant of `runList`) or `DEPENDENT` (no clock: after its parents, `dependsOn`)."
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
        return only_for(JobType.ONE_SHOT, value, info)

    @field_validator("delay_seconds")
    @classmethod
    def _delay_for_type(cls, value: int | None, info: ValidationInfo) -> int | None:
        if info.data.get("type") is JobType.ONE_SHOT and value is not None:
            raise ValueError("is not allowed for ONE_SHOT jobs; they take runAt")
        return only_for(JobType.DELAYED, value, info)

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str | None, info: ValidationInfo) -> str | None:
        only_for(JobType.CRON, value, info)
        if value is not None and info.data.get("type") is JobType.CRON:
            try:
                parse_cron(value)
            except ScheduleError as exc:
                raise ValueError(exc.message) from None
        return value

    @field_validator("interval_sec")
    @classmethod
    def _interval_for_type(cls, value: int | None, info: ValidationInfo) -> int | None:
        return only_for(JobType.INTERVAL, value, info)

    @field_validator("run_list")
    @classmethod
    def _run_list_for_type(cls, value: list[datetime] | None, info: ValidationInfo) -> list[datetime] | None:
        return only_for(JobType.RUN_LIST, value, info)

    @field_validator("start_at", "end_at", "max_runs")
    @classmethod
    def _bounds_are_for_recurring_jobs(cls, value: Any, info: ValidationInfo) -> Any:
        return recurring_only(value, info)


def only_for(job_type: JobType, value: _T, info: ValidationInfo) -> _T:
    """A type-specific field: required for ``job_type``, refused for the others (naming what they take)."""
    actual = info.data.get("type")
    if actual is None:  # the type itself was invalid: that error is enough
        return value
    if actual is job_type and value is None:
        raise ValueError(f"is required for {job_type} jobs")
    if actual is not job_type and value is not None:
        raise ValueError(f"is only for {job_type} jobs; {actual} jobs take {TYPE_FIELDS[actual]}")
    return value


def recurring_only(value: _T, info: ValidationInfo) -> _T:
    job_type = info.data.get("type")
    if value is not None and job_type is not None and job_type not in RECURRING_TYPES:
        raise ValueError(f"is only for CRON, INTERVAL and RUN_LIST jobs, not {job_type}")
    return value


class SchedulePreviewRequest(ScheduleFields):
    """A schedule to try out before trusting it: the schedule fields of a job body, and how many fires to list."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"type": "CRON", "schedule": "30 2 * * *", "timezone": "America/New_York"}]}
    )

    count: Annotated[StrictInt, Field(ge=1, le=MAX_PREVIEW)] = Field(10, description="How many fires to list (1–1000).")
