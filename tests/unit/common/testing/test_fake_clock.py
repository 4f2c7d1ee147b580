"""FakeClock: time moves only when the test moves it, monotonic time never goes back, and sleepers wake exactly
when their time has come."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from sundial_common.runtime.clock import Clock
from sundial_common.runtime.clock import Clock as SleepingClock
from sundial_common.testing import FakeClock

START = datetime(2030, 5, 1, 12, 0, tzinfo=UTC)


def test_wall_and_monotonic_time_stand_still_until_advanced_and_then_move_together() -> None:
    clock: Clock = FakeClock(START, monotonic=50.0)
    assert (clock.now(), clock.monotonic()) == (START, 50.0)
    assert (clock.now(), clock.monotonic()) == (START, 50.0), "reading does not move it"
    assert isinstance(clock, FakeClock)
    clock.advance(1.5)
    clock.advance(timedelta(minutes=1))
    assert (clock.now(), clock.monotonic()) == (START + timedelta(seconds=61.5), 111.5)


def test_the_wall_clock_may_jump_either_way_but_monotonic_time_never_goes_back() -> None:
    clock = FakeClock(START)
    clock.set(START - timedelta(hours=1))
    assert clock.now() == START - timedelta(hours=1) and clock.monotonic() == 1000.0
    with pytest.raises(ValueError, match="forward only"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="timezone-aware"):
        clock.set(datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        FakeClock(datetime(2030, 1, 1))


async def test_a_sleeper_wakes_once_the_clock_has_moved_its_whole_delay_and_not_before() -> None:
    clock: SleepingClock = FakeClock()
    assert isinstance(clock, FakeClock)
    woke: list[str] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(name)

    tasks = [asyncio.create_task(sleeper("short", 1.0)), asyncio.create_task(sleeper("long", 3.0))]
    await asyncio.sleep(0)
    assert clock.sleepers == 2 and woke == []
    clock.advance(0.5)
    await asyncio.sleep(0)
    assert woke == [], "half the delay"
    clock.advance(0.5)
    await asyncio.sleep(0)
    assert woke == ["short"]
    clock.advance(5)
    await asyncio.gather(*tasks)
    assert woke == ["short", "long"] and clock.sleepers == 0
    await asyncio.wait_for(clock.sleep(0), 1)  # no delay: back after one turn of the loop
