"""The room each pool and tenant has in a fair pass: queue caps that follow each pool's start rate, stalled pools,
the tenants' concurrency quotas — from one shared read of the open executions per dispatcher process.

In :class:`OpenWork`, *what was published since the last read* (in a pool's drain) is this process's count:
what its passes took for the pool, and, while one pool alone has open work, what its uncontended passes took
without looking up whose it was (the pool is not known there; with several pools those count for none, and the
cap errs short). The other dispatcher processes publish for the shards they lead, and a pool's jobs hash evenly
over the shards, so that count is scaled by all shards over the shards this process leads. Without the scaling,
two processes each measured half the drain, and a backlog's cap fell to ``pool_queue_min`` (the other's publishes
outgrew the starts it saw) and doubled back, again and again: a steady 2,500/s held its work back for seconds at a
time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from redis.exceptions import RedisError
from sundial_common.coordination.pool_service import LiveWorkers
from sundial_common.stores.tenants import Tenant, TenantStore

from sundial_dispatcher.fairness.config import FairnessConfig
from sundial_dispatcher.fairness.queues import NOBODY, PRIORITIES, FairQueue, Waiting
from sundial_dispatcher.fairness.registry import RegisteredPools

log = logging.getLogger(__name__)


class OpenWork:
    """The open executions per pool and tenant as one dispatcher process sees them: the room each pass has.

    One read of ``open_executions`` (an aggregate over the open rows) serves every shard this process leads for
    ``counts_refresh_sec``; what a pass takes is added to the counts at once, so the next pass of any of these
    shards sees less room before the next read (the other processes see it at their next read, and each shard's
    pass fills only its share of the room, so together they stay near the cap).

    **Stalled pools.** The cap keeps a pool's queue short for the workers that are consuming it. A pool whose
    executions wait while none runs, for ``stalled_pool_sec`` in a row, has no worker starting anything (none
    was started, or all died; a process that sees the pool for the first time dates the stall from its oldest
    waiting execution, so a restarted or new leader does not wait ``stalled_pool_sec`` again): nothing there
    starts sooner for being held back, and holding it back would stop the execution rows themselves (what a
    user sees as dispatched, what the sweeper republishes from). Its cap is lifted, and its work is dispatched in
    the round robin's order as fast as without fairness, until one of its executions runs again. A pool whose
    workers are all busy with long handlers is not stalled (they run).

    **Each pool's cap follows its start rate.** A Kafka topic is first in, first out: work published behind a
    pool's queue (a tenant's ``HIGH`` job behind its own ``LOW`` backlog) waits until the workers have started
    everything ahead of it. So a backlogged pool's queue is kept to ``pool_queue_sec`` of its starts: at each
    read, a pool whose queue is at least half full has its cap set from how fast its workers drained it since
    the last read (PENDING then + published since − PENDING now); one whose workers emptied more than half of
    it while the passes held its work back (the cap, not the workers, was the limit) doubles it, or takes the
    drain's rate if that is more (a steady 2,500/s: a queue emptied at 2,000/s while its cap was 8). Between
    ``pool_queue_min`` and ``pool_queue_cap``. A pool nobody publishes to keeps its cap. A pool this process
    has not seen start anything (no worker yet, or this dispatcher just started and the pool is idle) is capped
    at what its live workers can start now: the free slots they announce (:mod:`sundial_common.hotwindow.
    worker_announcements`, read at most every ``slots_refresh_sec``) — two idle workers of 256 slots take a first
    burst of 512 at once, a worker of 4 slots takes 4, and the rest of the burst waits in the buffer, in priority
    order, so ``HIGH`` work due during it is queued behind what the workers are starting, not behind the whole
    burst. While held at that cap the counts are read again after ``first_refresh_sec``, so the rest follows once
    the workers started it, and so while its workers outpace its cap (up to ``pool_queue_cap``). At the first read
    that sees the pool start work its cap is set from that drain, not from ``pool_queue_min`` (a 333/s spread:
    doubling from 4 to the ~166 it needed held its work back for its first 1.5-2 s).
    A pool with no live worker announced (or while the announcements cannot be read) has the small
    ``pool_queue_first`` until a worker appears or the stalled-pool rule lifts it (``stalled_pool_sec``). Ordering
    the work (priority inside a tenant, the round robin across tenants) therefore happens in the buffer, not behind
    a long queue, with one topic per pool: no priority lanes in Kafka (docs/guides/priority.md says why).

    This is the one place that says how much each pool may take in a pass.
    """

    def __init__(
        self,
        store: TenantStore,
        config: FairnessConfig,
        clock: Callable[[], float] = time.monotonic,
        *,
        live: LiveWorkers | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        #: The workers' announcements (None: not read, every unmeasured pool has ``pool_queue_first``).
        self.live = live
        #: Per pool with a live worker: the free slots its workers announced at the last read of ``live``.
        self.slots: dict[str, int] = {}
        self._slots_at: float | None = None
        self.registry = RegisteredPools(store, config.slots_refresh_sec)  # read by each pass, as often as ``slots``
        self._lock = asyncio.Lock()
        self._read_at: float | None = None
        #: Per pool: queued (recent PENDING) executions, counting what this process took since the read.
        self.queued: dict[str, int] = {}
        #: Per pool: of ``queued``, those dispatched within ``stuck_queue_sec`` (and what this process took).
        self.fresh: dict[str, int] = {}
        #: Per tenant: open (PENDING or RUNNING) executions, counting what this process took since the read.
        self.open: dict[str, int] = {}
        #: Occurrences taken since the read whose pool is not known (the uncontended path): counted against
        #: every pool, which errs on the side of a short queue.
        self.unattributed = 0
        #: Per pool with work waiting: when (``clock``) it was last seen running something or began waiting.
        self._flowing_at: dict[str, float] = {}
        #: The pools stalled at the last read (their change is logged).
        self._stalled_seen: set[str] = set()
        #: Per pool: its queue cap now (absent: ``pool_queue_min``), the PENDING count at the last read, what
        #: this process published there since (attributed), and whether a pass held work back for it since.
        self.caps: dict[str, int] = {}
        #: Pools this process has seen start work (one RUNNING, or its queue drained): only their caps follow
        #: the start rate. Elsewhere the cap is what the live workers can start (:meth:`first_cap`).
        self.started_work: set[str] = set()
        #: The fair queues of the shards this process leads (see :meth:`best_lane_elsewhere`).
        self.queues: dict[int, FairQueue] = {}
        self._unstarted: dict[str, int] = {}
        self._took: dict[str, int] = {}
        self._limited: set[str] = set()
        #: Pools whose workers outpaced their cap (under ``pool_queue_cap``) at the last read: :meth:`_refresh_sec`.
        self._outpaced: set[str] = set()
        #: All the shards (each pass says, :meth:`pool_room`); ``queues`` holds those this process leads.
        self._shards = 1

    async def refresh(self) -> None:
        """Read the counts again if older than :meth:`_refresh_sec` allows (one reader at a time)."""
        async with self._lock:
            now = self.clock()
            if self._read_at is not None and now - self._read_at < self._refresh_sec():
                return
            rows = await self.store.open_executions(self.config.stale_queue_sec, self.config.stuck_queue_sec)
            await self._read_slots(now)
            queued: dict[str, int] = {}
            fresh: dict[str, int] = {}
            pending: dict[str, int] = {}
            unstarted: dict[str, int] = {}  # pending and those published ahead (the drain's count)
            running: dict[str, int] = {}
            opened: dict[str, int] = {}
            waited: dict[str, float] = {}
            for row in rows:
                waited[row.pool] = max(waited.get(row.pool, 0.0), row.waited_sec or 0.0)
                queued[row.pool] = queued.get(row.pool, 0) + row.queued
                fresh[row.pool] = fresh.get(row.pool, 0) + (row.queued if row.fresh is None else row.fresh)
                pending[row.pool] = pending.get(row.pool, 0) + row.pending
                unstarted[row.pool] = unstarted.get(row.pool, 0) + row.pending + row.ahead
                running[row.pool] = running.get(row.pool, 0) + row.running
                opened[row.tenant_id] = opened.get(row.tenant_id, 0) + row.open
            flowing_at = {}
            for pool, waiting in pending.items():
                if waiting:
                    # A pool first seen (this process just started or took over) with none running: the
                    # oldest wait says since when at the latest, so a new leader does not wait afresh.
                    flowing_at[pool] = now if running.get(pool) else self._flowing_at.get(pool, now - waited[pool])
            # Stalled as of the last read (not the old map read at the new time: a pool that crossed the threshold
            # between the two reads would be in both sets, and its stall never said).
            was_stalled = self._stalled_seen
            busy = {pool for pool, n in running.items() if n}
            self.started_work.update(busy)
            if self._read_at is not None and now > self._read_at:
                self._adapt_caps(queued, unstarted, busy, now - self._read_at)
            self._unstarted, self._took, self._limited = unstarted, {}, set()
            self.queued, self.fresh, self.open, self.unattributed = queued, fresh, opened, 0
            self._flowing_at = flowing_at
            self._read_at = now
            self._stalled_seen = {pool for pool in flowing_at if self.stalled(pool)}
            self._outpaced = {
                p for p in self.started_work if 2 * queued.get(p, 0) < self.cap(p) < self.config.pool_queue_cap
            }
            for pool in sorted(self._stalled_seen ^ was_stalled):
                if pool in was_stalled:
                    log.info("pool %s: no longer stalled (one runs, or none waits); its queue cap holds again", pool)
                else:
                    log.warning(
                        "pool %s: %d executions waiting and none running for %.0f s (no worker?); its queue cap "
                        "is lifted until one runs",
                        pool,
                        pending[pool],
                        self.config.stalled_pool_sec,
                    )

    def _refresh_sec(self) -> float:
        """``first_refresh_sec`` while a pool with live workers is held at its first cap (they may have started all
        of it already: only a read can tell), or at a cap its workers outpaced (queue under half of it; the next read
        doubles it: a burst no longer climbs to ``pool_queue_cap`` with an empty queue), else ``counts_refresh_sec``."""
        first = {pool for pool in self._limited if pool in self.slots and pool not in self.started_work}
        if first or self._limited & self._outpaced:
            return min(self.config.counts_refresh_sec, self.config.first_refresh_sec)
        return self.config.counts_refresh_sec

    async def _read_slots(self, now: float) -> None:
        """The free slots of each pool's live workers, read again if older than ``slots_refresh_sec`` (one Redis
        round trip for every pool). Unreadable: the last reading stands (the stalled-pool rule still applies)."""
        if self.live is None or (self._slots_at is not None and now - self._slots_at < self.config.slots_refresh_sec):
            return
        self._slots_at = now
        try:
            found = await self.live.live_pools()
        except (RedisError, OSError) as exc:
            log.debug("worker announcements not read: %r", exc)
            return
        self.slots = {pool: sum(w.free_slots for w in workers) for pool, workers in found.items()}

    def _adapt_caps(self, queued: dict[str, int], unstarted: dict[str, int], running: set[str], elapsed: float) -> None:
        """Each pool's cap from its drain since the last read (see the class docstring). ``unstarted``: PENDING,
        due or published ahead (what is held in a worker for its due instant was published, not started: counted
        as drained, a pool with no worker would look like one starting work, its cap would follow a drain that did
        not happen, and its work would stop until the stalled-pool rule lifted the cap)."""
        cfg = self.config
        pools = self._unstarted.keys() | self._took.keys() | unstarted.keys()
        unattributed = self.unattributed if len(pools | running) == 1 else 0
        # The other processes published about as much for the shards they lead (none led here: count as is).
        everyone = max(1.0, self._shards / len(self.queues)) if self.queues else 1.0
        for pool in pools:
            took = self._took.get(pool, 0) + unattributed
            # Started work only if this process's own publishes show it (a lower bound of everyone's): the
            # scaled estimate errs high while shards move between processes, and would take a pool with no worker
            # for one with workers draining it (its cap then holds dispatch until the stalled-pool rule lifts it).
            if self._unstarted.get(pool, 0) + took - unstarted.get(pool, 0) > 0:
                self.started_work.add(pool)
            drained = self._unstarted.get(pool, 0) + round(took * everyone) - unstarted.get(pool, 0)
            if pool not in self.started_work:
                continue
            # Over at least ``counts_refresh_sec``: a read sooner after a first burst (``first_refresh_sec``) sees the
            # free slots fill at once, not a start rate the workers keep up (4 slots of 1 s handlers: 40/s).
            rate_cap = round(drained / max(elapsed, cfg.counts_refresh_sec) * cfg.pool_queue_sec) if drained > 0 else 0
            cap = self.caps.get(pool)
            # First seen starting work (what it started since the last read, not the floor; or what its workers
            # announce they can still start, if more: a dispatcher that just took over a busy pool has seen no
            # drain yet), or backlogged (the workers set the pace): the drain's rate.
            if cap is None:
                cap = max(rate_cap, self.slots.get(pool, 0))
            elif 2 * queued.get(pool, 0) >= cap:
                # A read sooner than ``counts_refresh_sec`` (the cap was outpaced) sees too short a drain to lower it.
                cap = rate_cap if elapsed >= cfg.counts_refresh_sec else max(cap, rate_cap)
            elif pool in self._limited:  # the workers keep up with what the cap lets through
                cap = max(2 * cap, rate_cap)
            self.caps[pool] = min(cfg.pool_queue_cap, max(cfg.pool_queue_min, cap))

    def best_lane_elsewhere(self, shard: int) -> Callable[[str, str], int]:
        """For ``shard``'s pass: the best lane a tenant has waiting for a pool in the other shards' queues."""
        others = [q for s, q in self.queues.items() if s != shard]

        def best(tenant: str, pool: str) -> int:
            return min((q.best_lane(tenant, pool) for q in others), default=len(PRIORITIES))

        return best

    def cap(self, pool: str) -> int:
        if pool not in self.started_work:
            return self.first_cap(pool)
        return self.caps.get(pool, self.config.pool_queue_min)

    def first_cap(self, pool: str | None) -> int:
        """The cap of a pool this process has not seen start work: the free slots its live workers announced (at
        least one, at most ``pool_queue_cap``), or ``pool_queue_first`` with none announced (None: a pool not
        known at all)."""
        cfg = self.config
        slots = self.slots.get(pool) if pool is not None else None
        if slots is None:
            return min(cfg.pool_queue_cap, max(cfg.pool_queue_min, cfg.pool_queue_first))
        return min(cfg.pool_queue_cap, max(1, slots))

    def limited(self, pools: Iterable[str]) -> None:
        """A pass held work back because these pools' queues were full."""
        self._limited.update(pools)

    def stalled(self, pool: str) -> bool:
        """Work of ``pool`` has waited with none of it running for ``stalled_pool_sec``."""
        since = self._flowing_at.get(pool)
        return since is not None and self.clock() - since >= self.config.stalled_pool_sec

    def pool_room(self, shards: int, batch_size: int) -> tuple[dict[str, int], int]:
        """Room of this shard's pass per pool seen, and for a pool not seen (nothing queued there)."""
        self._shards = shards
        room = {pool: self._room(pool, 1) for pool in self.queued.keys() | self.started_work | self.slots.keys()}
        room.update({pool: batch_size for pool in self._flowing_at if self.stalled(pool)})
        room[NOBODY] = batch_size  # jobs gone meanwhile: nothing will be published for them
        # A pool not seen at all (nothing open there at the last read, no worker announced) has not been seen
        # start work either.
        return room, self._share(self.first_cap(None), 0)

    def high_room(self) -> dict[str, int]:
        """Room of this shard's pass per pool for a tenant's ``HIGH`` work: up to twice the rate-following cap.

        What a pool's queue holds is about ``pool_queue_sec`` of its starts, mostly the backlog's. ``HIGH`` work
        that waited for room in the buffer as well waited twice: for a census to show a start (every
        ``counts_refresh_sec``), once per job of its wave, then behind the queue. So it may fill the queue to
        twice the cap: it waits behind one cap's worth at most, and a flood of it is still held back (in the
        buffer, in priority order) beyond that. Call after :meth:`pool_room` (it records the shards)."""
        return {pool: self._room(pool, 2) for pool in self.queued.keys() | self.started_work | self.slots.keys()}

    def retry_room(self, default_room: int) -> dict[str, int]:
        """Room of this shard's pass per pool for scheduled retries: while the pool's queue is under
        ``retry_queue_share`` of its cap. A re-drive's retries then keep the topic short for the scheduled work
        published behind them, which takes the rest of the room (and the round robin's turns) first. A pool not
        seen (under :data:`NOBODY`) has that share of ``default_room``. Call after :meth:`pool_room` (it records
        the shards)."""
        share = self.config.retry_queue_share
        room = {pool: self._room(pool, share) for pool in self.queued.keys() | self.started_work | self.slots.keys()}
        room[NOBODY] = max(1, round(share * default_room))
        return room

    def _room(self, pool: str, cap_times: float) -> int:
        queued = self.queued.get(pool, 0)
        fresh = self.fresh.get(pool, queued)
        cap = max(1, round(cap_times * self.cap(pool)))
        return min(self._share(cap, fresh), self._share(self.config.pool_queue_cap, queued))

    def _share(self, cap: int, queued: int) -> int:
        """This shard's share of the room left under ``cap`` (rounded up: every shard may take one)."""
        return -(-max(0, cap - queued - self.unattributed) // self._shards)

    def tenant_room(self, tenants: dict[str, Tenant]) -> dict[str, int]:
        """Room under ``maxConcurrentExecutions`` for the tenants that have the quota (others: absent)."""
        return {
            t.id: max(0, t.quotas.max_concurrent_executions - self.open.get(t.id, 0))
            for t in tenants.values()
            if t.quotas.max_concurrent_executions is not None
        }

    def took(self, taken: Iterable[Waiting]) -> None:
        """Count what a pass took, until the next read has it."""
        self.took_executions((item.tenant, item.pool) for item in taken)

    def took_executions(self, created: Iterable[tuple[str, str]]) -> None:
        """Count executions created ((tenant, pool) each; a pass, or children and backfills), until the next read."""
        for tenant, pool in created:
            self.queued[pool] = self.queued.get(pool, 0) + 1
            self.fresh[pool] = self.fresh.get(pool, 0) + 1
            self._took[pool] = self._took.get(pool, 0) + 1
            self.open[tenant] = self.open.get(tenant, 0) + 1

    def took_unattributed(self, n: int) -> None:
        self.unattributed += n
