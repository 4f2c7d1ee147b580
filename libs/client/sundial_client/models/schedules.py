"""Job types and the schedule preview (`POST /v1/schedules:preview`, `GET /v1/jobs/{id}/preview`)."""

from __future__ import annotations

import enum
from datetime import datetime

from pydantic import Field

from sundial_client.models.common import ViewModel


class JobType(enum.StrEnum):
    ONE_SHOT = "ONE_SHOT"
    DELAYED = "DELAYED"
    CRON = "CRON"
    INTERVAL = "INTERVAL"
    RUN_LIST = "RUN_LIST"
    DEPENDENT = "DEPENDENT"


class Fire(ViewModel):
    """One upcoming fire of a schedule."""

    scheduled_for: datetime = Field(description="The occurrence's nominal instant, UTC.")
    fire_at: datetime = Field(description="When it fires: `scheduledFor` plus the job's jitter, UTC.")
    local: str = Field(description="`scheduledFor` on the wall clock of the schedule's zone, with its offset.")


class Preview(ViewModel):
    timezone: str
    fires: list[Fire] = Field(description="The next fires, soonest first; fewer than asked if the schedule ends.")
