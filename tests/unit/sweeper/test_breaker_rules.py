"""The retry circuit breaker's rules without I/O: settings validation and the loop's decisions."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

import pytest
from sundial_common.stores.breakers import Breaker, BreakerSettings
from sundial_sweeper.breakers import BreakerLoop, BreakerLoopConfig

S = BreakerSettings(min_attempts=20, failure_ratio=0.5, cooldown_sec=30, max_cooldown_sec=100, probes=3)
NOW = datetime(2026, 11, 24, tzinfo=UTC)


def breaker(state: str = "CLOSED", **fields: object) -> Breaker:
    base = Breaker(
        id=uuid.uuid4(),
        tenant_id="acme",
        pool="demo",
        handler="send",
        state=state,
        since=NOW,
        since_attempts=0,
        since_failures=0,
        attempts=0,
        failures=0,
        opened_at=None,
        next_probe_at=None,
        cooldown_sec=30.0,
        probe_limit=3,
        probes_sent=0,
        opens=0,
        manual=False,
        version=1,
        updated_at=NOW,
    )
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


def decide(b: Breaker, attempts: int, failures: int, settings: BreakerSettings = S) -> tuple[str, float | None] | None:
    move = BreakerLoop(None, None, BreakerLoopConfig(defaults=settings))._decide(b, settings, attempts, failures)  # type: ignore[arg-type]
    return None if move is None else (move.to_state, move.next_probe_in_sec)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("failure_ratio", 0),
        ("failure_ratio", 1.5),
        ("min_attempts", 0),
        ("window_sec", 0.5),
        ("probes", 0),
        ("cooldown_sec", 0),
        ("release_spread_sec", -1),
    ],
)
def test_bad_settings_are_refused_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field.split("_")[0]):
        BreakerSettings(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="maxCooldownSec"):
        BreakerSettings(cooldown_sec=60, max_cooldown_sec=30)


def test_a_tenant_overrides_what_it_names_and_keeps_the_rest() -> None:
    merged = S.merged({"failureRatio": 0.8, "probes": None, "unknown": 1})
    assert (merged.failure_ratio, merged.probes, merged.min_attempts) == (0.8, 3, 20)


def test_closed_opens_at_the_ratio_only_with_enough_attempts() -> None:
    assert decide(breaker(), 19, 19) is None
    assert decide(breaker(), 40, 19) is None
    assert decide(breaker(), 40, 20) == ("OPEN", 30)


def test_open_waits_its_cool_down_then_goes_half_open() -> None:
    assert decide(breaker("OPEN"), 50, 50) is None
    assert decide(breaker("OPEN", probe_due=True), 50, 50) == ("HALF_OPEN", 30)
    assert decide(breaker("OPEN", probe_due=True, manual=True), 0, 0) is None  # an operator's open stays


def test_half_open_closes_on_its_probes_and_reopens_longer_on_a_failure() -> None:
    half = breaker("HALF_OPEN", held=10)
    assert decide(half, 2, 0) is None  # waiting for the third probe
    assert decide(half, 3, 0) == ("CLOSED", None)
    assert decide(half, 2, 1) == ("OPEN", 60)
    assert decide(breaker("HALF_OPEN", held=10, cooldown_sec=80.0), 1, 1) == ("OPEN", 100)  # capped
    assert decide(breaker("HALF_OPEN", held=0), 1, 0) == ("CLOSED", None)  # nothing more to probe with
    assert decide(breaker("HALF_OPEN", held=10, probe_due=True), 0, 0) == ("HALF_OPEN", 30)  # new probes


def test_a_tenant_that_turned_it_off_closes_what_is_open() -> None:
    off = dataclasses.replace(S, enabled=False)
    assert decide(breaker("OPEN"), 50, 50, off) == ("CLOSED", None)
    assert decide(breaker(), 50, 50, off) is None
