"""Retry circuit breakers as the API shows them (`/v1/breakers`), a tenant's breaker settings (the admin
tenants API's `breaker`), and a job's own `breaker` choice."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StrictBool, StrictFloat, StrictInt
from sundial_client.models.breakers import (
    BreakerList,
    BreakerSettingsView,
    BreakerState,
    BreakerView,
    FirstFires,
    JobBreakerView,
)
from sundial_common.stores.breakers import MAX_HOLD_SEC, Breaker, BreakerSettings

from sundial_api.models.common import RequestModel

_D = BreakerSettings()

# StrictFloat takes an integer too (never a string); bounds on a union with StrictInt would reach the OpenAPI
# document under pydantic's names (`ge`, `le`) rather than JSON Schema's (`minimum`, `maximum`).
Seconds = Annotated[StrictFloat, Field(ge=1, le=86400)]


class BreakerSettingsBody(RequestModel):
    """A tenant's retry circuit breaker settings; a field left out (or null) takes the service default
    (`SUNDIAL_BREAKER_*`, shown here as each field's default)."""

    enabled: StrictBool | None = Field(
        None, description=f"Breakers of this tenant open at all (default {str(_D.enabled).lower()})."
    )
    failure_ratio: Annotated[StrictFloat, Field(gt=0, le=1)] | None = Field(
        None, description=f"Opens at this share of failed attempts in the window (default {_D.failure_ratio:g})."
    )
    min_attempts: Annotated[StrictInt, Field(ge=1, le=1_000_000)] | None = Field(
        None, description=f"... of at least this many finished attempts (default {_D.min_attempts})."
    )
    window_sec: Annotated[StrictFloat, Field(ge=1, le=3600)] | None = Field(
        None, description=f"The sliding window, seconds (default {_D.window_sec:g})."
    )
    cooldown_sec: Seconds | None = Field(
        None,
        description=f"Open this long before half-open probes; doubled at each re-open (default {_D.cooldown_sec:g}).",
    )
    max_cooldown_sec: Seconds | None = Field(
        None, description=f"The longest cool-down (default {_D.max_cooldown_sec:g}); at least `cooldownSec`."
    )
    probes: Annotated[StrictInt, Field(ge=1, le=100)] | None = Field(
        None, description=f"Retries a half-open breaker lets through as probes (default {_D.probes})."
    )
    release_spread_sec: Annotated[StrictFloat, Field(ge=0, le=3600)] | None = Field(
        None,
        description=f"A closing breaker releases its held retries at random over this many seconds "
        f"(default {_D.release_spread_sec:g}).",
    )
    max_hold_sec: Annotated[StrictFloat, Field(ge=1, le=MAX_HOLD_SEC)] | None = Field(
        None,
        description=f"The longest a retry is held; then its attempt ends without running (`BreakerHeld`, DEAD if it "
        f"was the last) — a handler that stays broken fills the dead-letter queue (default {_D.max_hold_sec:g}).",
    )

    def overrides(self) -> dict[str, Any] | None:
        """The fields given, camelCase, as ``tenants.breaker`` stores them (None: all defaults)."""
        given = {f: getattr(self, f) for f in self.model_fields_set if getattr(self, f) is not None}
        return {BreakerSettingsBody.model_fields[f].alias or f: v for f, v in given.items()} or None


class JobBreaker(RequestModel):
    """How the job meets its handler's retry circuit breaker."""

    enabled: StrictBool = Field(
        True, description="`false`: this job's retries are never held (it opts out of its handler's breaker)."
    )
    first_fires: FirstFires = Field(
        FirstFires.RUN,
        description="While the breaker is OPEN or HALF_OPEN: `RUN` fires the job's occurrences as usual; `HOLD` "
        "lets them wait (the job's next fire stays due) until the breaker closes.",
    )
    max_hold_sec: Annotated[StrictFloat, Field(ge=1, le=MAX_HOLD_SEC)] | None = Field(
        None,
        description="The longest this job's retries are held; then the attempt ends without running (`BreakerHeld`, "
        "DEAD if it was the last). Absent: the tenant's `maxHoldSec`.",
    )


def render_breaker(b: Breaker) -> dict[str, object]:
    return {
        "id": str(b.id),
        "pool": b.pool,
        "handler": b.handler,
        "state": b.state,
        "failureRatio": round(b.failure_ratio, 4) if b.failure_ratio is not None else None,
        "attempts": b.attempts,
        "failures": b.failures,
        "held": b.held,
        "openedAt": b.opened_at,
        "nextProbeAt": b.next_probe_at,
        "cooldownSec": b.cooldown_sec,
        "probesSent": b.probes_sent,
        "opens": b.opens,
        "manual": b.manual,
        "updatedAt": b.updated_at,
    }
