"""``service.every(idle_interval=…)``: a loop polling for rare work slows down while idle and is quick again
as soon as a pass finds something."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from sundial_common.runtime import service


@dataclass(frozen=True)
class Found:
    items: int = 0


async def test_idle_passes_double_the_wait_up_to_the_idle_interval_and_work_resets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stop = asyncio.Event()
    found = [0, 0, 0, 0, 0, 3, 0, 0]
    waits: list[float] = []

    async def recorded_sleep(_stop: asyncio.Event, seconds: float) -> bool:
        waits.append(seconds)
        return len(waits) == len(found)

    async def run_once() -> Found:
        return Found(found[len(waits)])

    monkeypatch.setattr(service, "sleep_or_stop", recorded_sleep)
    await asyncio.wait_for(service.every(stop, 0.5, run_once, name="unit-idle", idle_interval=4.0), 10)

    assert waits == [1.0, 2.0, 4.0, 4.0, 4.0, 0.5, 1.0, 2.0]


async def test_without_an_idle_interval_the_period_never_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []

    async def recorded_sleep(_stop: asyncio.Event, seconds: float) -> bool:
        waits.append(seconds)
        return len(waits) == 4

    async def run_once() -> Found:
        return Found(0)

    monkeypatch.setattr(service, "sleep_or_stop", recorded_sleep)
    await asyncio.wait_for(service.every(asyncio.Event(), 2.0, run_once, name="unit-steady"), 10)

    assert waits == [2.0, 2.0, 2.0, 2.0]
