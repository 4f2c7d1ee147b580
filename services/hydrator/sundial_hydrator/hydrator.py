"""The hydrator: keeps each shard's Redis hot window equal to what Postgres says is due soon.

Per shard it remembers, in Redis itself, the instant up to which it has promoted jobs (the
watermark). Each pass promotes ``[watermark, now + hot_window)`` by an indexed keyset range scan, in
batches, then moves the watermark — atomically with the members, and only if the watermark is
still the one it read. A flushed or restarted-empty Redis has no watermark, so the next pass simply
rebuilds the whole window from Postgres: no special recovery mode.

Every few passes it also re-adds *overdue* jobs — active, due more than a grace period ago, still
not fired — whose member was lost (an API replica that could not reach Redis, a dispatcher killed
between claiming a member and committing). Adding a member twice is harmless: the dispatcher only
acts on members that still match Postgres, and an occurrence can have only one execution.

Scheduled retries (``executions.next_attempt_at``, member ``r:<execution id>``) get the same treatment as
jobs: promoted by an indexed range scan behind the same watermark (so a flushed Redis gets them back in the
rebuild pass), and re-added by the overdue scan when their member was lost (a dispatcher killed after
claiming it, a worker that could not reach Redis after recording the failure). This is where a lost retry
comes back, rather than in the sweeper: the hydrator is the one process that writes Postgres' view of "due
soon" into Redis, and the watermark that makes a flush harmless covers retries only if they go through it.

A pass that finds a shard's watermark at most a *promotion slice* behind the window's edge
(``HydratorConfig.promote_lag_sec``: 10 s of the default hour) leaves it alone: nothing can be due within the
slice for the next ~59 minutes, and whoever registers a job due sooner than the window's edge adds it
to Redis itself (the API, the dispatcher, the worker's retries). So an idle pass is one MGET of the
watermarks and the census (two Redis round trips), where it was two range scans in Postgres, a GET and
a script per shard, every second; the watermarks are still read every second, so a flushed Redis is
rebuilt on the next pass as before. Measured by bench/workloads/idle.py and bench/workloads/at_rest.py.

The shards being promoted take turns, a page each, each shard's pages in due order. A rebuild at scale (a flushed
Redis under 10,000,000 recurring jobs: minutes of pages) therefore restores every shard's next minute in its first
round, where shard by shard the last shard's near-due members waited for the whole hour of the shards before it.

Several hydrators may run at once: every write is idempotent or compare-and-set.

After each pass the hydrator reports each shard's window in ``sundial_hot_window_members{shard}`` and
``sundial_hot_window_oldest_due_age_seconds{shard}`` (how long its earliest member has been due; 0 when
nothing is overdue — a growing age means no dispatcher is claiming that shard). Only the active hydrator
does, and one that stops leading removes its series (:meth:`Hydrator.forget_gauges`).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from prometheus_client import Gauge
from sundial_common.hotwindow.window import HotWindow
from sundial_common.observability.metrics import HOT_WINDOW_MEMBERS, HOT_WINDOW_OLDEST_DUE_AGE
from sundial_common.runtime.clock import Clock, SystemClock, from_ms, to_ms
from sundial_common.stores import Stores
from sundial_common.stores.types import Occurrence, RetryDue

log = logging.getLogger(__name__)
_BEGINNING = Occurrence(uuid.UUID(int=0), from_ms(0))
_FIRST_RETRY = RetryDue(uuid.UUID(int=0), from_ms(0))


@dataclass(frozen=True)
class HydratorConfig:
    """How the hydrator promotes; validated at construction."""

    shards: int = 1
    #: Occurrences due within this many seconds live in Redis.
    hot_window_sec: int = 3600
    #: Rows per range-scan page and per Redis write.
    batch_size: int = 5000
    #: Seconds between passes. The API adds near-due jobs itself, so this bounds only recovery.
    interval_sec: float = 1.0
    #: An active job this many seconds past due and not yet fired is re-added to its shard.
    overdue_grace_sec: float = 15.0
    #: Seconds between overdue scans.
    overdue_interval_sec: float = 10.0
    #: A shard is promoted once its watermark is this far behind ``now + hot_window_sec`` (capped at a
    #: sixtieth of the window, see ``promote_lag_sec``): passes in between cost no Postgres query.
    promote_slice_sec: float = 10.0

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ValueError("shards must be >= 1")
        if self.hot_window_sec < 10:
            raise ValueError("hot_window_sec must be >= 10")
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if self.interval_sec <= 0 or self.overdue_interval_sec <= 0 or self.promote_slice_sec < 0:
            raise ValueError("intervals must be > 0 (promote_slice_sec >= 0)")

    @property
    def promote_lag_sec(self) -> float:
        """How far the watermark may trail the window's edge before a pass promotes (0 = every pass)."""
        return min(self.promote_slice_sec, self.hot_window_sec / 60)


@dataclass(frozen=True)
class HydrationResult:
    promoted: int = 0
    recovered: int = 0
    rebuilt_shards: int = 0
    conflicts: int = 0
    #: Shards whose range was scanned this pass (the others were within the promotion slice).
    scanned_shards: int = 0


class Hydrator:
    def __init__(
        self, stores: Stores, hot_window: HotWindow, config: HydratorConfig, clock: Clock | None = None
    ) -> None:
        self.stores = stores
        self.hot_window = hot_window
        self.config = config
        self.clock = clock or SystemClock()
        self._last_overdue_scan = float("-inf")
        # The per-shard gauge children, bound at the first report (and again after forget_gauges).
        self._members: list[Gauge] = []
        self._oldest_due_age: list[Gauge] = []

    async def run_once(self) -> HydrationResult:
        recovered = 0
        scan_overdue = self.clock.monotonic() - self._last_overdue_scan >= self.config.overdue_interval_sec
        watermarks = await self.hot_window.watermarks(self.config.shards)
        due_below = to_ms(
            self.clock.now() + timedelta(seconds=self.config.hot_window_sec - self.config.promote_lag_sec)
        )
        trailing = {shard: w for shard, w in enumerate(watermarks) if w is None or w <= due_below}
        promoted, rebuilt, conflicts = await self._promote(trailing)
        if scan_overdue:
            recovered = await self._recover_overdue()
            self._last_overdue_scan = self.clock.monotonic()
        if rebuilt or recovered:
            log.info("hydrated: %d promoted, %d overdue re-added, %d shards rebuilt", promoted, recovered, rebuilt)
        await self._report_windows()
        return HydrationResult(promoted, recovered, rebuilt, conflicts, len(trailing))

    async def _report_windows(self) -> None:
        now = self.clock.now()
        census = await self.hot_window.census(self.config.shards)
        if not self._members:
            shards = [str(shard) for shard in range(self.config.shards)]
            self._members = [HOT_WINDOW_MEMBERS.labels(shard) for shard in shards]
            self._oldest_due_age = [HOT_WINDOW_OLDEST_DUE_AGE.labels(shard) for shard in shards]
        for (members, earliest), members_gauge, age_gauge in zip(
            census, self._members, self._oldest_due_age, strict=True
        ):
            members_gauge.set(members)
            age_gauge.set(max(0.0, (now - earliest).total_seconds()) if earliest is not None else 0.0)

    def forget_gauges(self) -> None:
        """Remove this hydrator's window series (it stopped leading: the new leader reports them)."""
        for shard in range(self.config.shards):
            for gauge in (HOT_WINDOW_MEMBERS, HOT_WINDOW_OLDEST_DUE_AGE):
                try:
                    gauge.remove(str(shard))
                except KeyError:
                    pass
        self._members = []
        self._oldest_due_age = []

    async def _promote(self, watermarks: dict[int, int | None]) -> tuple[int, int, int]:
        """Promote each shard's [watermark, horizon). Returns (members added, shards rebuilt from empty, conflicts).

        The shards take turns a page at a time (each shard's pages in due order), so after a flush every shard's
        next minute is back within the first round, not after the whole hour of every shard before it. A round is
        one statement for every shard still paging (``hydration_ranges``).
        """
        horizon = self.clock.now() + timedelta(seconds=self.config.hot_window_sec)
        promoted, retried = await self._promote_retries(watermarks, horizon)
        rebuilt = 0
        conflicts = len(watermarks) - len(retried)
        positions = {
            shard: _BEGINNING if watermark is None else Occurrence(uuid.UUID(int=0), from_ms(watermark))
            for shard, watermark in watermarks.items()
            if shard in retried
        }
        while positions:
            pages = await self.stores.jobs.hydration_ranges(positions, horizon, self.config.batch_size)
            for shard, page in pages.items():
                last_page = len(page) < self.config.batch_size
                # The watermark moves only with the last page: a crash mid-way just redoes the range.
                new_watermark = to_ms(horizon) if last_page else None
                if not await self.hot_window.hydrate(shard, watermarks[shard], new_watermark, page):
                    log.warning("shard %d: hot window changed under the hydrator (flushed?); will rebuild", shard)
                    conflicts += 1
                    del positions[shard]
                    continue
                promoted += len(page)
                if last_page:
                    rebuilt += watermarks[shard] is None
                    del positions[shard]
                else:
                    positions[shard] = page[-1]
        return promoted, rebuilt, conflicts

    async def _promote_retries(self, watermarks: dict[int, int | None], horizon: datetime) -> tuple[int, set[int]]:
        """Scheduled retries due in [watermark, horizon) of each shard, added without moving the watermark (the
        jobs' last page moves it), a page of every shard per statement. Returns (members added, the shards whose
        window took them all: the others changed under the hydrator)."""
        positions = {
            shard: _FIRST_RETRY if watermark is None else RetryDue(uuid.UUID(int=0), from_ms(watermark))
            for shard, watermark in watermarks.items()
        }
        ok = set(watermarks)
        promoted = 0
        while positions:
            pages = await self.stores.dispatch.retry_ranges(positions, horizon, self.config.batch_size)
            for shard, page in pages.items():
                if not page:
                    del positions[shard]
                    continue
                if not await self.hot_window.hydrate(shard, watermarks[shard], None, (), page):
                    log.warning("shard %d: hot window changed under the hydrator (flushed?); will rebuild", shard)
                    ok.discard(shard)
                    del positions[shard]
                    continue
                promoted += len(page)
                if len(page) < self.config.batch_size:
                    del positions[shard]
                else:
                    positions[shard] = page[-1]
        return promoted, ok

    async def _recover_overdue(self) -> int:
        before = self.clock.now() - timedelta(seconds=self.config.overdue_grace_sec)
        # Overdue jobs and manual triggers (POST /v1/jobs/{id}/trigger; a paused job can hold one too) whose member
        # was lost, and overdue retries: every shard in one statement each (idle, these scans were one statement per
        # shard: most of the hydrator's Postgres statements).
        shards = range(self.config.shards)
        lost = await self.stores.jobs.overdue_occurrences(shards, before, self.config.batch_size)
        lost_retries = await self.stores.dispatch.overdue_retries(shards, before, self.config.batch_size)
        recovered = 0
        for shard, overdue in lost.items():
            # A job (or retry) waiting in a live leader's fair buffer is due and unclaimed in Postgres, but not lost:
            # re-added, a burst's held jobs (or a re-drive's retries) would fill every page of this scan and crowd the
            # hot window ahead of others' work.
            overdue = await self.hot_window.not_held(shard, overdue)
            await self.hot_window.add(shard, overdue)
            retries = await self.hot_window.retries_not_held(shard, lost_retries[shard])
            await self.hot_window.add_retries(shard, retries)
            recovered += len(overdue) + len(retries)
        return recovered
