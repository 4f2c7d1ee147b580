"""The dispatcher process's census of dependency triggers and backfills (``sundial_dispatcher.side_work``): an idle
leader stops looking on its own, and the census's one look tells the shard with work to look now and wakes it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

from sundial_common.stores.backfills import BackfillStore
from sundial_common.stores.dependencies import DependencyStore
from sundial_dispatcher.backfills import BackfillConfig, BackfillDispatcher
from sundial_dispatcher.side_work import SideWork
from sundial_dispatcher.triggers import TriggerConfig, TriggerDispatcher, TriggerResult
from sundial_dispatcher.wakes import Alarm


class Census:
    def __init__(self) -> None:
        self.pending: set[int] = set()
        self.running: set[int] = set()
        self.asked: list[list[int]] = []

    async def shards_with_pending(self, shards: Sequence[int]) -> set[int]:
        self.asked.append(list(shards))
        return self.pending & set(shards)

    async def shards_running(self, shards: Sequence[int]) -> set[int]:
        return self.running & set(shards)


def _dispatchers(shard: int) -> tuple[TriggerDispatcher, BackfillDispatcher]:
    none = cast(Any, None)
    return (
        TriggerDispatcher(shard, 1, "me", none, none, none, TriggerConfig()),
        BackfillDispatcher(shard, 1, "me", none, none, none, BackfillConfig()),
    )


async def test_an_idle_watched_leader_waits_for_the_census_and_is_woken_by_it() -> None:
    census = Census()
    side_work = SideWork(cast(DependencyStore, census), cast(BackfillStore, census))
    triggers, backfills = _dispatchers(3)
    alarm = Alarm()
    leading = [True]
    side_work.watch(3, lambda: leading[0], triggers, backfills, alarm)

    # Idle looks double the interval; at the idle interval the leader stops looking on its own.
    triggers._interval = TriggerConfig().idle_interval_sec
    triggers._next_at = 0.0

    async def nothing() -> TriggerResult:
        return TriggerResult()

    triggers.run_once = nothing
    await triggers.run_if_due()
    assert triggers.next_run_in() == math.inf

    assert await side_work.run_once() == 0
    assert not alarm.ring.is_set()

    census.pending.add(3)
    alarm.plan(math.inf)
    assert await side_work.run_once() == 1
    assert triggers.next_run_in() <= 0  # looks on the next pass
    assert backfills.next_run_in() <= 0  # never ran: a new leader looks at once on its own
    assert alarm.ring.is_set()
    assert census.asked[-1] == [3]

    leading[0] = False  # the term ended: the census forgets the shard, and a process leading nothing reads nothing
    looks = len(census.asked)
    assert await side_work.run_once() == 0
    assert len(census.asked) == looks


async def test_a_busy_leader_keeps_its_own_cadence() -> None:
    triggers, _ = _dispatchers(0)
    triggers.watched = True

    async def fired() -> TriggerResult:
        return TriggerResult(fired=1)

    triggers.run_once = fired
    await triggers.run_if_due()
    assert 0 < triggers.next_run_in() <= TriggerConfig().interval_sec
