"""Dependency triggers and backfills of every shard a dispatcher process leads: one look a second for all of them.

A shard leader runs its dependency triggers (:mod:`sundial_dispatcher.triggers`) and backfills
(:mod:`sundial_dispatcher.backfills`) beside its dispatch passes. While they find work each looks on its own
(every 0.1 / 0.2 s); a look that finds nothing doubles the interval, up to their ``idle_interval_sec`` (1 s).
Once there, a watched shard stops looking on its own: :class:`SideWork` looks for every shard of the process
in one statement for both kinds (``shards_with_side_work``, on ``job_triggers`` and ``backfills``) every
``interval_sec``, and tells a shard where something waits to look now, waking its pass. So an idle process
costs Postgres one statement a second instead of two per shard it leads (16 a second over 8 shards in
``make up``), and a dependent job's child or a new backfill after a quiet spell still starts within
``interval_sec`` of being recorded, as with the per-shard looks.

A look that fails (Postgres away) is logged and tried again on the next period; the shards' own dispatch
passes fail meanwhile as well, and resume looking on their own once they find work again.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from sundial_common.runtime.clock import Clock
from sundial_common.runtime.service import sleep_or_stop
from sundial_common.stores.dependencies import DependencyStore

from sundial_dispatcher.wakes import Alarm

log = logging.getLogger(__name__)


class Cadence:
    """When a shard leader's triggers or backfills look next: every ``interval_sec`` while they find work, at once
    while a look leaves more waiting, doubling up to ``idle_interval_sec`` while they find nothing; once idle and
    ``watched`` by the census, not on their own at all until it says :meth:`look_now`."""

    def __init__(self, interval_sec: float, idle_interval_sec: float, clock: Clock) -> None:
        self.interval_sec = interval_sec
        self.idle_interval_sec = idle_interval_sec
        self.clock = clock
        self._next_at = 0.0  # a new leader looks at once
        self._interval = interval_sec
        #: Set by the process's census (:class:`SideWork`): once its looks are idle, this leader stops looking
        #: on its own and the census says when to look (:meth:`look_now`).
        self.watched = False

    def due(self) -> bool:
        """Time for the next look."""
        return self.clock.monotonic() >= self._next_at

    def looked(self, *, found: bool, more: bool = False) -> None:
        """A look ended: it ``found`` work (and left ``more`` waiting), or nothing."""
        if more:
            self._interval = 0.0
        elif found:
            self._interval = self.interval_sec
        else:
            self._interval = min(max(self._interval, self.interval_sec) * 2, self.idle_interval_sec)
        idle = self._interval >= self.idle_interval_sec
        self._next_at = math.inf if idle and self.watched else self.clock.monotonic() + self._interval

    def look_now(self) -> None:
        """Look on the next pass (the census found work for this shard)."""
        self._next_at = 0.0

    def next_run_in(self) -> float:
        """Seconds until the next look (the pass loop sleeps no longer; ``inf``: only when the census says)."""
        return self._next_at - self.clock.monotonic()


@dataclass(frozen=True)
class _Watched:
    #: The term is still on (the census forgets a shard whose term ended).
    active: Callable[[], bool]
    triggers: Cadence
    backfills: Cadence
    #: Wakes the shard's pass loop, so the look happens now rather than at its next wake (None: it polls).
    alarm: Alarm | None


class SideWork:
    """The process's census of the shards with dependency triggers waiting or a backfill running."""

    def __init__(self, dependencies: DependencyStore, interval_sec: float = 1.0) -> None:
        if interval_sec <= 0:
            raise ValueError("interval_sec must be > 0")
        self._dependencies = dependencies
        self.interval_sec = interval_sec
        self._shards: dict[int, _Watched] = {}

    def watch(
        self, shard: int, active: Callable[[], bool], triggers: Cadence, backfills: Cadence, alarm: Alarm | None
    ) -> None:
        """From now on ``shard``'s leader (its term ``active``) relies on the census while its own looks are idle."""
        triggers.watched = backfills.watched = True
        self._shards[shard] = _Watched(active, triggers, backfills, alarm)

    async def run_once(self) -> int:
        """One look at every watched shard; how many were told to look now."""
        for shard in [s for s, w in self._shards.items() if not w.active()]:
            del self._shards[shard]
        if not self._shards:
            return 0
        shards = sorted(self._shards)
        pending, running = await self._dependencies.shards_with_side_work(shards)
        told = 0
        for shard in pending | running:
            watched = self._shards.get(shard)
            if watched is None or not watched.active():  # the term ended during the look
                continue
            if shard in pending:
                watched.triggers.look_now()
            if shard in running:
                watched.backfills.look_now()
            if watched.alarm is not None:
                watched.alarm.added(-math.inf)
            told += 1
        return told

    async def run(self, stop: asyncio.Event) -> None:
        while not await sleep_or_stop(stop, self.interval_sec):
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("side work: cannot look for triggers and backfills (%r); trying again", exc)
