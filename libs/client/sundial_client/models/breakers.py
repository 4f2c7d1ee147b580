"""Retry circuit breakers: a handler's breaker (`GET /v1/breakers`), a job's and a tenant's breaker settings."""

from __future__ import annotations

import enum
from datetime import datetime

from pydantic import Field

from sundial_client.models.common import ViewModel


class BreakerState(enum.StrEnum):
    CLOSED = "CLOSED"
    OPEN = "OPEN"
    HALF_OPEN = "HALF_OPEN"


class FirstFires(enum.StrEnum):
    RUN = "RUN"
    HOLD = "HOLD"


class BreakerSettingsView(ViewModel):
    enabled: bool | None = None
    failure_ratio: float | None = None
    min_attempts: int | None = None
    window_sec: float | None = None
    cooldown_sec: float | None = None
    max_cooldown_sec: float | None = None
    probes: int | None = None
    release_spread_sec: float | None = None
    max_hold_sec: float | None = None


class JobBreakerView(ViewModel):
    enabled: bool = True
    first_fires: FirstFires = FirstFires.RUN
    max_hold_sec: float | None = None


class BreakerView(ViewModel):
    id: str = Field(description="The breaker's id (`POST /v1/breakers/{id}:close`).")
    pool: str
    handler: str
    state: BreakerState = Field(
        description="`CLOSED`: retries run. `OPEN`: retries are held (not attempted, not counted as attempts). "
        "`HALF_OPEN`: probe retries run; a failure ratio below `failureRatio` closes it, else it re-opens."
    )
    failure_ratio: float | None = Field(description="Failed / finished attempts in the current window (null: none).")
    attempts: int = Field(description="Finished attempts in the current window.")
    failures: int = Field(description="Failed attempts in the current window.")
    held: int = Field(description="Scheduled retries the breaker holds now.")
    opened_at: datetime | None
    next_probe_at: datetime | None = Field(
        description="OPEN: when it goes half-open. HALF_OPEN: when unanswered probes are sent again."
    )
    cooldown_sec: float
    probes_sent: int
    opens: int = Field(description="How many times it opened (re-opens included).")
    manual: bool = Field(description="Opened by an operator: stays open until `:close`.")
    updated_at: datetime


class BreakerList(ViewModel):
    items: list[BreakerView]
