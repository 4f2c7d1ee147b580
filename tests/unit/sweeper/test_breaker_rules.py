"""The retry circuit breaker's rules without I/O: settings validation and the loop's decisions."""

from __future__ import annotations

import dataclasses
import random
from datetime import UTC, datetime

import pytest
from sundial_common.stores.breakers import Breaker, BreakerSettings
from sundial_common.testing import InMemoryBreakerStore
from sundial_common.testing.breakers import new_breaker
from sundial_sweeper.breakers import BreakerLoop, BreakerLoopConfig

S = BreakerSettings(min_attempts=20, failure_ratio=0.5, cooldown_sec=30, max_cooldown_sec=100, probes=10)
NOW = datetime(2026, 11, 24, tzinfo=UTC)


def breaker(state: str = "CLOSED", **fields: object) -> Breaker:
    base = dataclasses.replace(new_breaker("acme", "demo", "send", NOW, NOW), cooldown_sec=30.0, probe_limit=10)
    return dataclasses.replace(base, state=state, **fields)  # type: ignore[arg-type]


def decide(b: Breaker, attempts: int, failures: int, settings: BreakerSettings = S) -> tuple[str, float | None] | None:
    loop = BreakerLoop(InMemoryBreakerStore(), None, BreakerLoopConfig(defaults=settings))
    move = loop._decide(b, settings, attempts, failures)
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
        ("max_hold_sec", 0),
    ],
)
def test_bad_settings_are_refused_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field.split("_")[0]):
        BreakerSettings(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="maxCooldownSec"):
        BreakerSettings(cooldown_sec=60, max_cooldown_sec=30)


def test_a_tenant_overrides_what_it_names_and_keeps_the_rest() -> None:
    merged = S.merged({"failureRatio": 0.8, "probes": None, "unknown": 1})
    assert (merged.failure_ratio, merged.probes, merged.min_attempts) == (0.8, 10, 20)


def test_closed_opens_at_the_ratio_only_with_enough_attempts() -> None:
    assert decide(breaker(), 19, 19) is None
    assert decide(breaker(), 40, 19) is None
    assert decide(breaker(), 40, 20) == ("OPEN", 30)


def test_open_waits_its_cool_down_then_goes_half_open() -> None:
    assert decide(breaker("OPEN"), 50, 50) is None
    assert decide(breaker("OPEN", probe_due=True), 50, 50) == ("HALF_OPEN", 30)
    assert decide(breaker("OPEN", probe_due=True, manual=True), 0, 0) is None  # an operator's open stays


def test_half_open_judges_the_failure_rate_of_its_probes_not_a_single_failure() -> None:
    half = breaker("HALF_OPEN", held=50)
    assert decide(half, 9, 0) is None  # waiting for the tenth probe
    assert decide(half, 10, 0) == ("CLOSED", None)
    assert decide(half, 10, 4) == ("CLOSED", None)  # 40 % < 50 %: flaky, not down
    assert decide(half, 3, 1) is None  # one failure is not a verdict
    assert decide(half, 7, 5) == ("OPEN", 60)  # 5 of 10 can no longer end below 50 %: re-open at once, longer
    assert decide(half, 10, 5) == ("OPEN", 60)
    assert decide(breaker("HALF_OPEN", held=10, cooldown_sec=80.0), 5, 5) == ("OPEN", 100)  # capped
    assert decide(breaker("HALF_OPEN", held=0), 1, 0) == ("CLOSED", None)  # nothing more to probe with
    assert decide(breaker("HALF_OPEN", held=0), 2, 1) == ("OPEN", 60)  # ... and what ended decides
    assert decide(breaker("HALF_OPEN", held=10, probe_due=True), 0, 0) == ("HALF_OPEN", 30)  # new probes


@pytest.mark.parametrize("seed", range(20))
def test_a_handler_failing_a_quarter_of_its_calls_is_let_go_once_it_is_probed(seed: int) -> None:
    # A handler failing 2 or 3 of every 10 calls (20-30 %), in any order: never re-opened on the way, closed at the
    # tenth probe.
    outcomes = [True] * (2 + seed % 2) + [False] * (8 - seed % 2)
    random.Random(seed).shuffle(outcomes)
    half = breaker("HALF_OPEN", held=100)
    for ended in range(1, S.probes):
        assert decide(half, ended, sum(outcomes[:ended])) is None
    assert decide(half, S.probes, sum(outcomes)) == ("CLOSED", None)


def test_the_defaults_tell_flaky_from_down_and_bound_holding() -> None:
    d = BreakerSettings()
    assert d.probes >= 10 and d.max_cooldown_sec <= 120 and d.max_hold_sec == 3600
    assert d.merged({"maxHoldSec": 60}).max_hold_sec == 60


def test_every_move_carries_the_tenants_hold_bound() -> None:
    bound = dataclasses.replace(S, max_hold_sec=90)
    loop = BreakerLoop(InMemoryBreakerStore(), None, BreakerLoopConfig(defaults=bound))
    for b, attempts, failures in [
        (breaker(), 40, 40),
        (breaker("OPEN", probe_due=True), 0, 0),
        (breaker("HALF_OPEN"), 10, 0),
    ]:
        move = loop._decide(b, bound, attempts, failures)
        assert move is not None and move.max_hold_sec == 90


def test_a_tenant_that_turned_it_off_closes_what_is_open() -> None:
    off = dataclasses.replace(S, enabled=False)
    assert decide(breaker("OPEN"), 50, 50, off) == ("CLOSED", None)
    assert decide(breaker(), 50, 50, off) is None
