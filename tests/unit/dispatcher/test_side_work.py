"""The dispatcher process's census of dependency triggers and backfills (``sundial_dispatcher.side_work``): an idle
leader stops looking on its own, and the census's one look tells the shard with work to look now and wakes it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import pytest
from sundial_common.runtime.clock import Clock
from sundial_common.stores.dependencies import DependencyStore
from sundial_common.testing import FakeClock
from sundial_dispatcher.backfills import BackfillConfig, BackfillDispatcher
from sundial_dispatcher.side_work import SideWork
from sundial_dispatcher.triggers import TriggerConfig, TriggerDispatcher, TriggerResult
from sundial_dispatcher.wakes import Alarm


class Census:
    def __init__(self) -> None:
        self.pending: set[int] = set()
        self.running: set[int] = set()
        self.asked: list[list[int]] = []

    async def shards_with_side_work(self, shards: Sequence[int]) -> tuple[set[int], set[int]]:
        self.asked.append(list(shards))
        return self.pending & set(shards), self.running & set(shards)


def _dispatchers(shard: int, clock: Clock | None = None) -> tuple[TriggerDispatcher, BackfillDispatcher]:
    none = cast(Any, None)
    return (
        TriggerDispatcher(shard, 1, "me", none, none, none, TriggerConfig(), clock=clock),
        BackfillDispatcher(shard, 1, "me", none, none, none, BackfillConfig(), clock=clock),
    )


async def test_an_idle_watched_leader_waits_for_the_census_and_is_woken_by_it(monkeypatch: pytest.MonkeyPatch) -> None:
    census = Census()
    side_work = SideWork(cast(DependencyStore, census))
    clock = FakeClock()
    triggers, backfills = _dispatchers(3, clock)
    alarm = Alarm()
    leading = [True]
    side_work.watch(3, lambda: leading[0], triggers.cadence, backfills.cadence, alarm)

    async def nothing() -> TriggerResult:
        return TriggerResult()

    monkeypatch.setattr(triggers, "run_once", nothing)
    # Idle looks double the interval (0.2, 0.4, 0.8 s); at the idle interval the leader stops looking on its own.
    waits = []
    while math.isfinite(wait := triggers.cadence.next_run_in()):
        clock.advance(max(wait, 0.0))
        assert await triggers.run_if_due() is not None
        waits.append(round(triggers.cadence.next_run_in(), 3))
        assert len(waits) < 10
    assert waits == [0.2, 0.4, 0.8, math.inf]
    clock.advance(3600)
    assert await triggers.run_if_due() is None

    assert await side_work.run_once() == 0
    assert not alarm.ring.is_set()

    census.pending.add(3)
    alarm.plan(math.inf)
    assert await side_work.run_once() == 1
    assert triggers.cadence.next_run_in() <= 0  # looks on the next pass
    assert backfills.cadence.next_run_in() <= 0  # never ran: a new leader looks at once on its own
    assert alarm.ring.is_set()
    assert census.asked[-1] == [3]

    leading[0] = False  # the term ended: the census forgets the shard, and a process leading nothing reads nothing
    looks = len(census.asked)
    assert await side_work.run_once() == 0
    assert len(census.asked) == looks


async def test_a_busy_leader_keeps_its_own_cadence_and_looks_again_at_once_after_a_full_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    triggers, _ = _dispatchers(0)
    triggers.cadence.watched = True
    fired = [1]

    async def fire() -> TriggerResult:
        return TriggerResult(fired=fired[0])

    monkeypatch.setattr(triggers, "run_once", fire)
    await triggers.run_if_due()
    assert 0 < triggers.cadence.next_run_in() <= TriggerConfig().interval_sec
    fired[0] = TriggerConfig().batch_children
    triggers.cadence.look_now()
    await triggers.run_if_due()
    assert triggers.cadence.next_run_in() <= 0
