"""The request bodies the client builds: a job to register, a schedule to preview, a backfill to ask for.

They are the client's own, not the server's request models: a field left unset (None) is left out of the
body, so the server applies its defaults, and the server alone validates what needs its clock or its
registry (the server's models refuse unknown fields and name each one at fault).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from sundial_client.models.executions import Priority
from sundial_client.models.jobs import Backoff, CatchupPolicy, OverlapPolicy
from sundial_client.models.schedules import JobType


class RequestBody(BaseModel):
    """A request body: unset (None) fields are left out, so the server applies its defaults."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        return wire


class Target(RequestBody):
    """Where an occurrence is delivered: a worker pool and a handler registered in it."""

    pool: str
    handler: str


class RetryPolicy(RequestBody):
    max_attempts: int | None = None
    backoff: Backoff | None = None
    initial_delay_ms: int | None = None
    max_delay_ms: int | None = None
    jitter: bool | None = None


class ScheduleFields(RequestBody):
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


class Dependency(RequestBody):
    """A parent of a DEPENDENT job, and the final state its execution must reach (SUCCEEDED, FAILED or ANY)."""

    job_id: str
    on: str | None = None


class NewJob(ScheduleFields):
    """A job to register (``POST /v1/jobs``): `type` and its own field say when, `target` where."""

    name: str
    #: Unique per tenant: registering the same body under it again answers the registered job.
    key: str | None = None
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


class SchedulePreviewRequest(ScheduleFields):
    """A schedule to try (``POST /v1/schedules:preview``) and how many fires to list."""

    count: int | None = None


class BackfillRequest(RequestBody):
    """``POST /v1/jobs/{id}:backfill``: the past range ``[from, to)`` of a recurring job to run."""

    range_from: datetime = Field(alias="from")
    range_to: datetime = Field(alias="to")
    overlap_policy: str | None = None
    rate_per_sec: float | None = None
    dry_run: bool | None = None
