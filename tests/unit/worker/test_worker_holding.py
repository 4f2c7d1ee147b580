"""sundial_worker.holding: what is held comes back at its instant (or its lead before it), earliest first."""

from __future__ import annotations

import asyncio
import time

from sundial_common.testing import FakeClock
from sundial_worker.holding import Holding


def test_items_come_back_only_once_their_instant_has_come_earliest_first_and_as_many_as_asked() -> None:
    clock = FakeClock(monotonic=100.0)
    holding: Holding[str] = Holding(cap=3, on_due=lambda: None, clock=clock.monotonic)
    holding.hold(105.0, "late")
    holding.hold(101.0, "early")
    holding.hold(103.0, "middle")
    assert holding.full()
    assert holding.due(10) == [] and not holding.waiting()

    clock.advance(4.0)
    assert holding.waiting()
    assert holding.due(1) == ["early"]  # one free slot: the earliest
    assert holding.due(10) == ["middle"]
    assert len(holding) == 1 and not holding.full() and not holding.waiting()
    assert holding.drain() == ["late"] and len(holding) == 0


async def test_the_timer_releases_each_item_at_its_instant_never_before_and_stops_with_the_stop() -> None:
    released: list[tuple[float, float]] = []  # (due, when released)
    both = asyncio.Event()

    def on_due() -> None:
        released.extend((due, time.time()) for due in holding.due(10))
        if len(released) == 2:
            both.set()

    holding: Holding[float] = Holding(cap=10, on_due=on_due)
    stopping = asyncio.Event()
    task = asyncio.create_task(holding.run(stopping))
    start = time.time()
    holding.hold(start + 0.2, start + 0.2)
    holding.hold(start + 0.05, start + 0.05)  # earlier than the timer was armed for: it re-arms

    await asyncio.wait_for(both.wait(), 10)
    assert [due for due, _ in released] == [start + 0.05, start + 0.2]
    assert all(at >= due for due, at in released)
    stopping.set()
    holding.wake()
    await asyncio.wait_for(task, 10)


async def test_items_coming_due_within_the_gather_of_the_earliest_are_released_with_it() -> None:
    releases: list[list[float]] = []
    done = asyncio.Event()

    def on_due() -> None:
        releases.append(holding.due(10))
        if sum(map(len, releases)) == 3:
            done.set()

    holding: Holding[float] = Holding(cap=10, on_due=on_due, gather_sec=0.05)
    stopping = asyncio.Event()
    task = asyncio.create_task(holding.run(stopping))
    start = time.time()
    for offset in (0.1, 0.12, 0.4):  # the first two within 50 ms of each other: one release, one start CAS
        holding.hold(start + offset, start + offset)

    await asyncio.wait_for(done.wait(), 10)
    assert releases == [[start + 0.1, start + 0.12], [start + 0.4]]
    stopping.set()
    holding.wake()
    await asyncio.wait_for(task, 10)


def test_with_a_lead_items_come_back_that_long_before_their_instant_with_those_due_within_the_gather() -> None:
    clock = FakeClock(monotonic=100.0)
    holding: Holding[str] = Holding(cap=10, on_due=lambda: None, clock=clock.monotonic, lead_sec=0.02, gather_sec=0.05)
    assert not holding.holds(100.01)  # due within the lead: claimed at once, not held
    for due, name in ((101.0, "first"), (101.04, "within"), (101.06, "after")):
        assert holding.holds(due)
        holding.hold(due, name)

    clock.advance(0.97)  # 30 ms before the first instant
    assert holding.due(10) == [] and not holding.waiting()
    clock.advance(0.011)  # 19 ms before it
    assert holding.waiting()
    assert holding.due(10) == ["first", "within"]  # the third is due 60 ms after the first: beyond the gather
    assert not holding.waiting() and len(holding) == 1
