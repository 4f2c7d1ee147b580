"""Weighted fair dispatch: which due occurrences a shard's pass takes, across tenants, pools and quotas.

Without it a pass takes the earliest members of the hot window: tenant A's 50,000 jobs due at midnight are
all taken (and published) before tenant B's 100 due at the same instant, and B waits for A's whole burst.
Two mechanisms make B wait for nobody:

**A per-tenant buffer, served by deficit round robin.** Each pass claims due members from the hot window
into the leader's buffer (up to ``claim_size`` a pass, ``buffer_cap`` held), learns whose each job is (one
primary-key query), and queues it in its tenant's FIFO. The pass then takes up to ``batch_size`` occurrences
round-robin over the tenants with work, each round giving a tenant ``weight`` more turns (DRR): under
contention each tenant gets dispatch in proportion to its weight, and a tenant with little work is served at
once. Within a tenant, priority orders the work (``HIGH``, then ``NORMAL``, then ``LOW``, each in due order, one
take in ten to the oldest whatever its priority: :class:`TenantQueue`); never across tenants.

**A burst is claimed before it is due.** Claiming and looking up tens of thousands of members takes passes
of a second or more; paid at the burst's due instant, that is lateness for every tenant in it. So when at
least ``claim_ahead_min`` members of the shard fall due within ``claim_ahead_sec``, the pass claims them
early (one Redis script counts and claims), looks up whose they are, and keeps them by due time in
``early``; each pass moves those now due into the round robin. Retries are never taken early.

**Short pool queues.** A Kafka topic is first in, first out: what is published behind a backlog waits for
it, whatever the dispatcher does later. So a pass publishes to a pool only while fewer of its executions are
PENDING (published, not started) than the pool's cap, about ``pool_queue_sec`` of its workers' starts
(:class:`OpenWork`): the backlog waits here, where the round robin can still put B's work first and a
tenant's ``HIGH`` work ahead of its ``LOW``, rather than in the topic. The same count per tenant enforces
``maxConcurrentExecutions`` (beyond it the tenant's work waits, late but never lost), and a Redis token
bucket per tenant (shared by every shard leader) ``maxDispatchPerSec``. A pool where nothing runs at all
(no worker) is not held back: that would stop dispatch without making anything start sooner
(:class:`OpenWork`).

**Cost.** The counts are one aggregate over the open executions, read by each dispatcher process at most
every ``counts_refresh_sec`` and shared by the shards it leads; whose each claimed job is (one primary-key
query) is looked up only when the pass cannot send everything it claimed at once (a backlog, a quota).

Members in the buffer are out of Redis but not dispatched: a term that ends puts them back
(:meth:`FairDispatch.release`), a pass whose reads fail puts back what it claimed and had not buffered yet
(as the dispatch pass does after a failed commit); if the leader dies instead, the jobs are still due in
Postgres and the hydrator's overdue scan puts them back (DESIGN invariant 1), as for any claimed member. While
a live leader holds them, a Redis set per shard (renewed every second, expiring ``held_ttl_sec`` after the last)
tells the overdue scan they are not lost: re-adding a burst's held jobs would refill the hot window ahead of
other tenants' members (measured: 20,000 re-added every 10 s, B's jobs 85 s late behind A's 100,000).
Scheduled retries pass straight through: they are executions already, their order is the hot window's.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

from redis.exceptions import RedisError
from sundial_common.hotwindow.rate_limits import TokenBuckets
from sundial_common.hotwindow.window import Claimed, HotWindow
from sundial_common.stores.tenants import Tenant, TenantStore
from sundial_common.stores.types import Occurrence

from sundial_dispatcher.tenancy import TenantPolicy

log = logging.getLogger(__name__)

#: How often a leader's held record is renewed while it claims nothing new (it lives ``held_ttl_sec``).
_HELD_RENEW_SEC = 1.0
#: The tenant of a claimed member whose job is gone (deleted meanwhile): the dispatch store sorts it out.
_NOBODY = ""


@dataclass(frozen=True)
class FairnessConfig:
    #: On by default (``SUNDIAL_DISPATCHER_FAIRNESS``); off: a pass takes the earliest due members, whoever they
    #: belong to (the behaviour before tenants), and the concurrency and dispatch-rate quotas do not act.
    enabled: bool = True
    #: Most executions of one pool waiting in its topic (PENDING) before the passes stop publishing to it;
    #: each shard's pass may fill its share (1/shards) of the room left, so concurrent passes stay under it.
    #: The ceiling of each pool's own cap, which follows its start rate (``pool_queue_sec``).
    pool_queue_cap: int = 1000
    #: A backlogged pool's queue holds about this many seconds of its workers' starts: what is published
    #: behind it (a tenant's ``HIGH`` work, another tenant's) waits at most about that long in the topic.
    #: Twice ``counts_refresh_sec``, so the workers never run dry between two reads of the counts.
    pool_queue_sec: float = 0.5
    #: The smallest cap of a pool. A pool first seen starting work gets the cap of the start rate measured at
    #: that read (not this floor: doubling from 4 held W2's first 1.5-2 s back), then follows its workers.
    #: Small: it is what a slow pool's queue holds (8 slots of 1 s handlers: 4 queued is half a second).
    pool_queue_min: int = 4
    #: The cap of a pool whose start rate this process has not measured yet (every pool after a dispatcher start
    #: or a failover, and a new pool): what its first burst may put in the topic before a read has seen its workers
    #: start anything. With ``pool_queue_cap`` there, a first burst of 1,000 ``LOW`` jobs went to the topic whole
    #: and ``HIGH`` work due during its drain waited behind all of it (one worker of 1 s handlers: P50 33 s). About
    #: a second of one small worker's starts (4 slots of 0.5 s handlers), so ``HIGH`` work due during a first burst
    #: waits behind about that much: what waits in the topic longer than ``stuck_queue_sec`` stops counting against
    #: the rate-following cap, so a larger first cap stays in front of a slow pool's ``HIGH`` work for as long as
    #: the backlog lasts (32 with 8 starts/s: 4-7 s). The cost is a fast pool's first second: its cap then grows
    #: from the drain, doubling per read (``counts_refresh_sec``) while its workers keep up, and reaches
    #: ``pool_queue_cap`` in about seven reads. Kept within ``pool_queue_min`` .. ``pool_queue_cap``.
    pool_queue_first: int = 8
    #: Most claimed occurrences one shard leader holds waiting for their turn.
    buffer_cap: int = 200_000
    #: Members claimed from the hot window into the buffer per pass. Deep, so a burst is in the buffer (and
    #: the round robin sees every tenant in it) after one pass: members due at one instant are claimed in id
    #: order, so with 2,000 a pass tenant B's jobs created after A's 12,500 per shard waited 6-7 passes (B's
    #: P50 4.1 s at 50,000 + 100, 1.5 s with 20,000, same quiet machine). A claim this deep happens once
    #: per burst; a steady stream claims only what is due, far less.
    claim_size: int = 20_000
    #: A burst is claimed ahead of its due time: when at least ``claim_ahead_min`` members of a shard are due
    #: within ``claim_ahead_sec``, a pass claims them (and looks up whose they are) before they are due, and
    #: holds them until then. Claiming 4 x 12,500 members took ~1.4 s of passes on a loaded machine (4 x 25,000:
    #: two claims a shard, more than 3 s): paid at due time, that was the first seconds of every tenant's
    #: lateness in the burst. A steady stream below 1,000 due/s a shard (8,000/s over 8 shards) never reaches
    #: the threshold and is claimed as it falls due.
    claim_ahead_sec: float = 5.0
    claim_ahead_min: int = 5_000
    #: A smaller burst is claimed ahead too, over a shorter horizon: ``burst_ahead_min`` members of a shard due
    #: within ``burst_ahead_sec`` (the same rate, 1,000/s a shard, so a steady stream below it is still claimed as
    #: it falls due, without the owners' lookup). W1's 10,000 at one instant is 1,250 a shard: claimed at the due
    #: instant, the claim, the owners' lookup and the held record of every member came before the first publish.
    #: The leader looks at its window ``burst_ahead_sec`` before its earliest member is due
    #: (:meth:`FairDispatch.next_look`), so the claim has that long.
    burst_ahead_sec: float = 1.0
    burst_ahead_min: int = 1_000
    #: The first pass of a burst claimed ahead (after a second without work taken) takes at most this many of its
    #: occurrences, and the next pass follows at once: the first executions start after one small dispatch
    #: transaction instead of one of a pool's whole share (W1 10,000: 125 a shard). 0: no head.
    burst_head: int = 16
    #: A PENDING execution dispatched longer ago than this no longer counts against its pool's queue: its
    #: message was lost (the broker restarted, a publish failed) and the sweeper sends it again; counted,
    #: such executions would stop the pool's dispatch until then.
    stale_queue_sec: float = 30.0
    #: A PENDING execution dispatched longer ago than this no longer counts against its pool's rate-following
    #: cap (``pool_queue_sec``; the fixed ``pool_queue_cap`` still counts it): in a queue of half a second of
    #: starts it is stuck, in the partitions of a worker that was killed or stopped until the group moves them
    #: (~5 s), and counting it would leave the pool's live workers with nothing while it sits there (measured:
    #: 4.5-5.2 s without a start in the worker fault tests, against a 3 s bound).
    stuck_queue_sec: float = 1.0
    #: A pool with executions PENDING and none RUNNING for this long has no worker starting its work (none
    #: runs, or none is left): holding its work back would make nothing start sooner, only stop dispatch, so
    #: the pool's queue cap is lifted until something runs there again (see :class:`OpenWork`).
    stalled_pool_sec: float = 3.0
    #: How long the record of the jobs a leader's buffer holds outlives its last pass (renewed every pass):
    #: the hydrator's overdue scan leaves held jobs alone, and recovers them once a dead leader's record expires.
    held_ttl_sec: float = 30.0
    #: How long one dispatcher process reuses its read of the open executions (shared by the shards it leads;
    #: what its passes take meanwhile is counted in at once).
    counts_refresh_sec: float = 0.25

    def __post_init__(self) -> None:
        if not 1 <= self.pool_queue_min <= self.pool_queue_cap or self.pool_queue_sec <= 0:
            raise ValueError("pool_queue_min must be in [1, pool_queue_cap] and pool_queue_sec > 0")
        if self.claim_size < 1 or self.buffer_cap < self.claim_size:
            raise ValueError("claim_size must be >= 1 and buffer_cap >= claim_size")
        if self.stalled_pool_sec <= 0 or self.counts_refresh_sec < 0:
            raise ValueError("stalled_pool_sec must be > 0 and counts_refresh_sec >= 0")
        if self.burst_head < 0:
            raise ValueError("burst_head must be >= 0")


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
    user sees as dispatched, what the sweeper republishes from). Its cap
    is lifted, and its work is dispatched in the round robin's order as fast as without fairness, until one of
    its executions runs again. A pool whose workers are all busy with long handlers is not stalled (they run).

    **Each pool's cap follows its start rate.** A Kafka topic is first in, first out: work published behind a
    pool's queue (a tenant's ``HIGH`` job behind its own ``LOW`` backlog) waits until the workers have started
    everything ahead of it. So a backlogged pool's queue is kept to ``pool_queue_sec`` of its starts: at each
    read, a pool whose queue is at least half full has its cap set from how fast its workers drained it since
    the last read (PENDING then + published since − PENDING now); one whose workers emptied more than half of
    it while the passes held its work back (the cap, not the workers, was the limit) doubles it, or takes the
    drain's rate if that is more (W3: a queue emptied at 2,000/s while its cap was 8). Between
    ``pool_queue_min`` and ``pool_queue_cap``. A pool nobody publishes to keeps its cap. A pool this process
    has not seen start anything (no worker yet, or this dispatcher just started and the pool is idle) has the
    small ``pool_queue_first``: its first burst waits in the buffer, in priority order, beyond that, so ``HIGH``
    work due during it is not queued behind the whole burst; at the first read that sees it start work its cap
    is set from that drain, not from ``pool_queue_min`` (W2: doubling from 4 to the ~166 it needed held its work
    back for its first 1.5-2 s). A pool with no worker at all keeps that small cap until the stalled-pool rule
    lifts it (``stalled_pool_sec``). Ordering the work
    (priority inside a tenant, the round robin across tenants) therefore happens in the buffer, not behind a
    long queue, with one topic per pool: no priority lanes in Kafka (README "Priority" gives the figures).

    *What was published since the last read* is this process's count: what its passes took for the pool, and,
    while one pool alone has open work, what its uncontended passes took without looking up whose it was (the
    pool is not known there; with several pools those count for none, and the cap errs short). The other
    dispatcher processes publish for the shards they lead, and a pool's jobs hash evenly over the shards, so
    that count is scaled by all shards over the shards this process leads. Without the scaling, two processes
    each measured half the drain, and a backlog's cap fell to ``pool_queue_min`` (the other's publishes outgrew
    the starts it saw) and doubled back, again and again: W3 at 2,500/s held its work back for seconds at a time.

    This is the one place that says how much each pool may take in a pass.
    """

    def __init__(self, store: TenantStore, config: FairnessConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.config = config
        self.clock = clock
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
        #: Per pool with work waiting: the last time (``clock``) it was seen running something or just began
        #: waiting. Absent: nothing waits there.
        self._flowing_at: dict[str, float] = {}
        #: Per pool: its queue cap now (absent: ``pool_queue_min``), the PENDING count at the last read, what
        #: this process published there since (attributed), and whether a pass held work back for it since.
        self.caps: dict[str, int] = {}
        #: Pools this process has seen start work (one RUNNING, or its queue drained): only their caps follow
        #: the start rate. Elsewhere the cap is the small ``pool_queue_first`` (:attr:`first_cap`).
        self.started_work: set[str] = set()
        #: The fair queues of the shards this process leads (see :meth:`best_lane_elsewhere`).
        self.queues: dict[int, FairQueue] = {}
        self._unstarted: dict[str, int] = {}
        self._took: dict[str, int] = {}
        self._limited: set[str] = set()
        #: All the shards (each pass says, :meth:`pool_room`); ``queues`` holds those this process leads.
        self._shards = 1

    async def refresh(self) -> None:
        """Read the counts again if they are older than ``counts_refresh_sec`` (one reader at a time)."""
        async with self._lock:
            now = self.clock()
            if self._read_at is not None and now - self._read_at < self.config.counts_refresh_sec:
                return
            rows = await self.store.open_executions(self.config.stale_queue_sec, self.config.stuck_queue_sec)
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
            was_stalled = {pool for pool in self._flowing_at if self.stalled(pool)}
            busy = {pool for pool, n in running.items() if n}
            self.started_work.update(busy)
            if self._read_at is not None and now > self._read_at:
                self._adapt_caps(queued, unstarted, busy, now - self._read_at)
            self._unstarted, self._took, self._limited = unstarted, {}, set()
            self.queued, self.fresh, self.open, self.unattributed = queued, fresh, opened, 0
            self._flowing_at = flowing_at
            self._read_at = now
            for pool in sorted({pool for pool in flowing_at if self.stalled(pool)} ^ was_stalled):
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
            rate_cap = round(drained / elapsed * cfg.pool_queue_sec) if drained > 0 else 0
            cap = self.caps.get(pool)
            # First seen starting work (what it started since the last read, not the floor), or backlogged (the
            # workers set the pace): the drain's rate.
            if cap is None or 2 * queued.get(pool, 0) >= cap:
                cap = rate_cap
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
            return self.first_cap
        return self.caps.get(pool, self.config.pool_queue_min)

    @property
    def first_cap(self) -> int:
        """The cap of a pool this process has not seen start work (``FairnessConfig.pool_queue_first``)."""
        cfg = self.config
        return min(cfg.pool_queue_cap, max(cfg.pool_queue_min, cfg.pool_queue_first))

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
        room = {pool: self._room(pool, 1) for pool in self.queued.keys() | self.started_work}
        room.update({pool: batch_size for pool in self._flowing_at if self.stalled(pool)})
        room[_NOBODY] = batch_size  # jobs gone meanwhile: nothing will be published for them
        # A pool not seen at all (nothing open there at the last read) has not been seen start work either.
        return room, self._share(self.first_cap, 0)

    def high_room(self) -> dict[str, int]:
        """Room of this shard's pass per pool for a tenant's ``HIGH`` work: up to twice the rate-following cap.

        What a pool's queue holds is about ``pool_queue_sec`` of its starts, mostly the backlog's. ``HIGH`` work
        that waited for room in the buffer as well waited twice: for a census to show a start (every
        ``counts_refresh_sec``), once per job of its wave, then behind the queue. So it may fill the queue to
        twice the cap: it waits behind one cap's worth at most, and a flood of it is still held back (in the
        buffer, in priority order) beyond that. Call after :meth:`pool_room` (it records the shards)."""
        return {pool: self._room(pool, 2) for pool in self.queued.keys() | self.started_work}

    def _room(self, pool: str, cap_times: int) -> int:
        queued = self.queued.get(pool, 0)
        fresh = self.fresh.get(pool, queued)
        return min(self._share(cap_times * self.cap(pool), fresh), self._share(self.config.pool_queue_cap, queued))

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


#: Priorities, highest first: a tenant's queue serves its lanes in this order.
PRIORITIES = ("HIGH", "NORMAL", "LOW")
_LANE = {p: i for i, p in enumerate(PRIORITIES)}


@dataclass(frozen=True, slots=True)
class Waiting:
    occurrence: Occurrence
    tenant: str
    pool: str
    priority: str = "NORMAL"


class TenantQueue:
    """One tenant's claimed occurrences: a FIFO per priority lane, served highest lane first.

    Each lane stays in claim (due) order. One take in every ``oldest_every`` goes to the longest-waiting
    occurrence (the earliest due over all lanes) whatever its priority: under a sustained ``HIGH`` load its
    ``NORMAL`` and ``LOW`` work still gets at least that share of the tenant's dispatch, oldest first, so
    nothing waits forever (and with nothing ``HIGH`` waiting it changes no order at all).
    """

    __slots__ = ("_served", "lanes", "oldest_every")

    def __init__(self, oldest_every: int) -> None:
        self.lanes: tuple[deque[Waiting], ...] = tuple(deque() for _ in PRIORITIES)
        self.oldest_every = oldest_every
        self._served = 0

    def __len__(self) -> int:
        return sum(len(lane) for lane in self.lanes)

    def __bool__(self) -> bool:
        return any(self.lanes)

    def __iter__(self) -> Iterator[Waiting]:
        for lane in self.lanes:
            yield from lane

    def append(self, item: Waiting) -> None:
        self.lanes[_LANE.get(item.priority, 1)].append(item)

    def appendleft(self, item: Waiting) -> None:
        self.lanes[_LANE.get(item.priority, 1)].appendleft(item)

    def _next_lane(self) -> deque[Waiting]:
        if self.oldest_turn():
            return min((lane for lane in self.lanes if lane), key=lambda lane: lane[0].occurrence.due)
        return next(lane for lane in self.lanes if lane)

    def oldest_turn(self) -> bool:
        """The next take goes to the longest-waiting item, whatever its priority."""
        return (self._served + 1) % self.oldest_every == 0

    def head(self) -> Waiting:
        """The item :meth:`popleft` would take (the queue is not empty)."""
        return self._next_lane()[0]

    def popleft(self) -> Waiting:
        item = self._next_lane().popleft()
        self._served += 1
        return item


@dataclass
class FairQueue:
    """Per-tenant queues of claimed occurrences (by priority, see :class:`TenantQueue`) and their round-robin
    deficits (pure: no I/O). Priority orders work inside a tenant's queue only: the round robin between
    tenants never looks at it, so marking everything ``HIGH`` buys a tenant nothing against the others."""

    queues: dict[str, TenantQueue] = field(default_factory=dict)
    deficits: dict[str, float] = field(default_factory=dict)
    #: Jobs held here. The hydrator's overdue scan re-adds a job that waits here past its grace to the hot
    #: window (it cannot tell held from lost); claimed again, it must not queue twice.
    held: set[UUID] = field(default_factory=set)
    #: One take in this many of a tenant's goes to its longest-waiting work whatever its priority.
    oldest_every: int = 10
    #: The pools whose full queue held a tenant's next item back in the last :meth:`take`.
    full_pools: set[str] = field(default_factory=set)
    #: Items waiting per (tenant, pool) and lane (an index of :data:`PRIORITIES`): what another shard's pass
    #: in the same process asks (:meth:`best_lane`) before it lets a tenant's lower-priority work go first.
    waiting: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    #: Where the next round starts, so no tenant is always first.
    _turn: int = 0

    def _count(self, item: Waiting, n: int) -> None:
        counts = self.waiting.get((item.tenant, item.pool))
        if counts is None:
            counts = self.waiting[(item.tenant, item.pool)] = [0] * len(PRIORITIES)
        counts[_LANE.get(item.priority, 1)] += n

    def best_lane(self, tenant: str, pool: str) -> int:
        """The highest lane (lowest index) with work of ``tenant`` for ``pool`` waiting here; past the last if none."""
        counts = self.waiting.get((tenant, pool))
        return next((i for i, n in enumerate(counts) if n), len(PRIORITIES)) if counts else len(PRIORITIES)

    def _queue(self, tenant: str) -> TenantQueue:
        queue = self.queues.get(tenant)
        if queue is None:
            queue = self.queues[tenant] = TenantQueue(self.oldest_every)
        return queue

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def add(self, items: Iterable[Waiting]) -> None:
        for item in items:
            if item.occurrence.job_id not in self.held:
                self.held.add(item.occurrence.job_id)
                self._queue(item.tenant).append(item)
                self._count(item, 1)

    def add_arrival(self, arrival: Arrival) -> None:
        """Queue the occurrences of one claim that fell due at one instant (:class:`Arrival`), in their order.

        A burst claimed ahead is thousands of them at once (W1 100,000: 12,500 a shard); queued one by one at its
        due instant, in each of the four shards a process leads, they held the burst's first transaction back (see
        :class:`EarlyWork`). None of them held yet (the usual case): each tenant lane takes its run in one step.
        Otherwise (one was claimed again meanwhile) one by one, as :meth:`add`, so none is queued twice."""
        if not self.held.isdisjoint(arrival.jobs):
            self.add(arrival.items)
            return
        self.held.update(arrival.jobs)
        for (tenant, lane), items in arrival.lanes.items():
            self._queue(tenant).lanes[lane].extend(items)
        for (tenant, pool, lane), n in arrival.counts.items():
            counts = self.waiting.get((tenant, pool))
            if counts is None:
                counts = self.waiting[(tenant, pool)] = [0] * len(PRIORITIES)
            counts[lane] += n

    def put_back(self, items: Sequence[Waiting]) -> None:
        """Return taken items to the front of their queues, in their order."""
        for item in reversed(items):
            self.held.add(item.occurrence.job_id)
            self._queue(item.tenant).appendleft(item)
            self._count(item, 1)

    def take(
        self,
        budget: int,
        weights: dict[str, int],
        pool_room: dict[str, int],
        tenant_room: dict[str, int],
        default_pool_room: int,
        elsewhere: Callable[[str, str], int] | None = None,
        high_room: dict[str, int] | None = None,
    ) -> list[Waiting]:
        """Up to ``budget`` items by weighted round robin; ``pool_room``/``tenant_room`` are used up as taken.

        A tenant whose next item's pool is full, or that has no room of its own, is passed over this pass.
        ``elsewhere(tenant, pool)``: the best lane the tenant has waiting for the pool in the other queues of
        this process (the other shards it leads); a priority pick of a lower lane yields to it this pass, so
        the pool's room goes to the tenant's higher-priority work whichever shard holds it (the turn of the
        oldest never yields: that is the no-starvation share). ``high_room``: per pool, the room ``HIGH`` work
        has beyond a full pool (:meth:`OpenWork.high_room`), used up by every ``HIGH`` item taken.
        """
        self.full_pools = set()
        high_room = {} if high_room is None else high_room
        tenants = [t for t, q in self.queues.items() if q]
        if not tenants:
            return []
        start = self._turn % len(tenants)
        order = tenants[start:] + tenants[:start]
        self._turn += 1
        taken: list[Waiting] = []
        blocked: set[str] = set()
        while len(taken) < budget and len(blocked) < len(order):
            for tenant in order:
                if tenant in blocked:
                    continue
                queue = self.queues[tenant]
                weight = max(1, weights.get(tenant, 1))
                self.deficits[tenant] = min(self.deficits.get(tenant, 0.0) + weight, 2.0 * weight)
                while self.deficits[tenant] >= 1 and queue and len(taken) < budget:
                    head = queue.head()
                    if tenant_room.get(tenant, budget) <= 0:
                        break
                    high = head.priority == PRIORITIES[0]
                    if pool_room.get(head.pool, default_pool_room) <= 0 and not (
                        high and high_room.get(head.pool, 0) > 0
                    ):
                        self.full_pools.add(head.pool)
                        break
                    if (
                        elsewhere is not None
                        and head.priority != PRIORITIES[0]
                        and not queue.oldest_turn()
                        and elsewhere(tenant, head.pool) < _LANE.get(head.priority, 1)
                    ):
                        break  # its higher-priority work in another shard's queue goes first
                    queue.popleft()
                    self._count(head, -1)
                    self.held.discard(head.occurrence.job_id)
                    taken.append(head)
                    self.deficits[tenant] -= 1
                    pool_room[head.pool] = pool_room.get(head.pool, default_pool_room) - 1
                    if high and head.pool in high_room:
                        high_room[head.pool] -= 1
                    if tenant in tenant_room:
                        tenant_room[tenant] -= 1
                if not queue:
                    self.deficits[tenant] = 0.0
                    blocked.add(tenant)
                elif self.deficits[tenant] >= 1 and len(taken) < budget:
                    blocked.add(tenant)  # stopped by a full pool or its own quota, not by its share
                if len(taken) >= budget:
                    break
        for tenant in [t for t, q in self.queues.items() if not q]:
            del self.queues[tenant]
            self.deficits.pop(tenant, None)
        for key in [k for k, counts in self.waiting.items() if not any(counts)]:
            del self.waiting[key]
        return taken


@dataclass(slots=True)
class Arrival:
    """The occurrences of one claim due at one instant, grouped for the fair queue when claimed (ahead of that
    instant), so that joining the queue at the instant is a step per tenant lane (:meth:`FairQueue.add_arrival`)."""

    due: datetime
    items: list[Waiting] = field(default_factory=list)
    #: Their jobs (a claim's members are distinct).
    jobs: set[UUID] = field(default_factory=set)
    #: Per (tenant, lane): its items, in claim order.
    lanes: dict[tuple[str, int], list[Waiting]] = field(default_factory=dict)
    #: Per (tenant, pool, lane): how many (the queue's ``waiting`` counts).
    counts: dict[tuple[str, str, int], int] = field(default_factory=dict)

    def append(self, item: Waiting) -> None:
        lane = _LANE.get(item.priority, 1)
        self.items.append(item)
        self.jobs.add(item.occurrence.job_id)
        run = self.lanes.get((item.tenant, lane))
        if run is None:
            run = self.lanes[(item.tenant, lane)] = []
        run.append(item)
        key = (item.tenant, item.pool, lane)
        self.counts[key] = self.counts.get(key, 0) + 1


class EarlyWork:
    """Occurrences claimed ahead of their due instant (a burst), waiting for it: one :class:`Arrival` per claim and
    instant, earliest first. A burst due at one instant is one entry, not a heap entry per occurrence: popping
    12,500 entries one by one at the instant and queueing them one by one took ~25 ms of CPU a shard (a process
    leads four), all before the burst's first transaction could begin (``bench/first_start.py``)."""

    def __init__(self) -> None:
        self._heap: list[tuple[datetime, int, Arrival]] = []
        self._arrivals = itertools.count()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Waiting]:
        for _, _, arrival in self._heap:
            yield from arrival.items

    def first_due(self) -> datetime | None:
        return self._heap[0][0] if self._heap else None

    def due(self, now: datetime) -> bool:
        return bool(self._heap) and self._heap[0][0] <= now

    def due_count(self, now: datetime, most: int) -> int:
        """How many are due by ``now``, counted up to more than ``most`` (a burst due is one look)."""
        n = 0
        if self.due(now):
            for due, _, arrival in self._heap:
                if due <= now:
                    n += len(arrival.items)
                    if n > most:
                        break
        return n

    def push(self, items: Iterable[Waiting]) -> None:
        """Hold ``items`` (one claim's, so no job twice) until each one's due instant."""
        arrivals: dict[datetime, Arrival] = {}
        for item in items:
            due = item.occurrence.due
            arrival = arrivals.get(due)
            if arrival is None:
                arrival = arrivals[due] = Arrival(due)
            arrival.append(item)
        for due, arrival in arrivals.items():
            heapq.heappush(self._heap, (due, next(self._arrivals), arrival))
            self._size += len(arrival.items)

    def pop_due(self, now: datetime) -> list[Arrival]:
        """The arrivals due by ``now``, earliest first."""
        due: list[Arrival] = []
        while self._heap and self._heap[0][0] <= now:
            arrival = heapq.heappop(self._heap)[2]
            self._size -= len(arrival.items)
            due.append(arrival)
        return due


class FairDispatch:
    """One shard leader's fair selection: claims into the buffer and hands each pass its share."""

    def __init__(
        self,
        shard: int,
        hot_window: HotWindow,
        store: TenantStore,
        policy: TenantPolicy,
        buckets: TokenBuckets,
        config: FairnessConfig,
        batch_size: int,
        shards: int = 1,
        open_work: OpenWork | None = None,
    ) -> None:
        self.shard = shard
        self.hot_window = hot_window
        self.store = store
        self.policy = policy
        self.buckets = buckets
        self.config = config
        self.batch_size = batch_size
        self.shards = shards
        #: Shared by the shard leaders of one process (a shard led alone gets its own).
        self.open_work = open_work or OpenWork(store, config)
        self.queue = FairQueue()
        self.open_work.queues[shard] = self.queue
        #: Claimed ahead of their due time (a burst), by due time: moved into ``queue`` as they fall due.
        self.early = EarlyWork()
        self._held_cleared = False
        #: When the held record was last renewed (monotonic), and the jobs taken since that it still lists: they
        #: leave it with the next renewal (one round trip), or at once when the buffer is empty.
        self._held_renewed = float("-inf")
        self._unhold: list[UUID] = []
        #: The last pass took only the head of a burst (``burst_head``): the next pass should follow at once.
        self.cut_short = False
        #: When a pass last took work from the buffer (monotonic): a burst's head is cut only after a quiet second,
        #: so a dense stream claimed ahead is not split into twice as many passes.
        self._took_at = float("-inf")
        #: The hot window's earliest member after the last claim (the pass loop sleeps until then).
        self._window_next: datetime | None = None

    async def claim(self, now: datetime, lead: timedelta = timedelta(0)) -> Claimed:
        """This pass's work: scheduled retries as claimed, and up to ``batch_size`` occurrences taken fairly.

        ``lead``: members due within it are claimed too, and sent ahead if the pass is uncontended (all it claimed
        fits the pools' room, no quota: a sparse stream; their workers hold them until due,
        ``DispatcherConfig.publish_lead_sec``). Otherwise they wait in ``early`` for their instant like a burst claimed
        ahead: what goes out ahead is never more than the pools' room, whose census does not count it (it waits in a
        worker, not in the topic).

        If a read fails after the claim (Postgres away), what is not in the buffer yet goes back to the hot
        window at once (as a failed pass puts back what it claimed), so it is claimed again as soon as the
        outage ends rather than at the hydrator's overdue scan.
        """
        room = self.config.buffer_cap - len(self.queue) - len(self.early)
        claimed = Claimed()
        self.cut_short = False
        self._window_next = now  # the buffer is full: look again on the poll interval
        due_by = now + lead
        if room > 0:
            claimed = await self.hot_window.claim_due(
                self.shard,
                due_by,
                min(self.config.claim_size, room),
                ahead=now + timedelta(seconds=self.config.claim_ahead_sec),
                ahead_min=self.config.claim_ahead_min,
                burst=now + timedelta(seconds=self.config.burst_ahead_sec),
                burst_min=self.config.burst_ahead_min,
            )
            self._window_next = claimed.next_due
        if not claimed and not len(self.queue) and not self.early.due(now):
            return claimed  # idle, or a burst claimed ahead and not due yet: no read at all
        buffered = False
        try:
            tenants = await self.policy.tenants()
            await self.open_work.refresh()
            pool_room, default_room = self.open_work.pool_room(self.shards, self.batch_size)
            if self._uncontended(claimed, now, due_by, tenants, pool_room, default_room):
                # Everything claimed goes out in this pass whoever it belongs to: the order within one pass
                # changes nothing, so the owners' lookup is skipped (the common case below saturation). So does
                # what an earlier, contended pass kept in ``early`` and is due now (see :meth:`_uncontended`).
                due = [w for arrival in self.early.pop_due(now) for w in arrival.items]
                self.open_work.took_unattributed(len(claimed.jobs))
                self.open_work.took(due)
                if due:
                    await self._release(due)
                    return Claimed(jobs=[w.occurrence for w in due] + claimed.jobs, retries=claimed.retries)
                return claimed
            if not self._held_cleared:  # what an earlier leader's buffer held is that leader's no more
                await self.hot_window.drop_held(self.shard)
                self._held_cleared = True
            if claimed.jobs:
                owners = await self.store.job_owners([o.job_id for o in claimed.jobs])
                waiting = [Waiting(o, *owners.get(o.job_id, (_NOBODY, _NOBODY, "NORMAL"))) for o in claimed.jobs]
                self.queue.add(w for w in waiting if w.occurrence.due <= now)
                self.early.push(w for w in waiting if w.occurrence.due > now)
            buffered = True
            await self._hold([o.job_id for o in claimed.jobs])
            budget = self.batch_size
            if self.early.due(now):
                if self.config.burst_head and not len(self.queue) and time.monotonic() - self._took_at > 1.0:
                    budget = min(budget, self.config.burst_head)  # a burst's first pass: its head only
                for arrival in self.early.pop_due(now):
                    self.queue.add_arrival(arrival)
            if not len(self.queue):
                return Claimed(retries=claimed.retries)
            taken = self.queue.take(
                budget,
                weights={t.id: t.weight for t in tenants.values()},
                pool_room=pool_room,
                tenant_room=self.open_work.tenant_room(tenants),
                default_pool_room=default_room,
                elsewhere=self.open_work.best_lane_elsewhere(self.shard) if len(self.open_work.queues) > 1 else None,
                high_room=self.open_work.high_room(),
            )
            self.open_work.limited(self.queue.full_pools)
            taken = await self._rate_limited(taken, tenants)
        except BaseException:
            lost = Claimed(jobs=[] if buffered else claimed.jobs, retries=claimed.retries)
            if lost:
                with contextlib.suppress(Exception):  # Redis away too: the hydrator's overdue scan recovers them
                    await asyncio.shield(self._put_back(lost))
            raise
        self.open_work.took(taken)
        self.cut_short = budget < self.batch_size and len(taken) == budget and bool(len(self.queue))
        if taken:
            self._took_at = time.monotonic()
        await self._release(taken)
        return Claimed(jobs=[w.occurrence for w in taken], retries=claimed.retries)

    async def _release(self, taken: Sequence[Waiting]) -> None:
        """``taken`` leave the held record: with its next renewal, or at once when nothing else waits here.
        Best effort: a job dispatched and still marked held is only skipped by the overdue scan (not lost: its next
        fire, if any, is requeued by the pass) until the record expires."""
        self._unhold += [w.occurrence.job_id for w in taken]
        if not len(self.queue) and not self.early:
            with contextlib.suppress(Exception):
                await self.hot_window.unhold(self.shard, self._unhold)
            self._unhold = []

    async def _hold(self, job_ids: list[UUID]) -> None:
        """Add ``job_ids`` to the held record and renew it, with what was taken since the last renewal leaving it,
        in one round trip. Nothing new: renewed once a second, not every pass (``held_ttl_sec`` is 30 s)."""
        now = time.monotonic()
        if not job_ids and now - self._held_renewed < _HELD_RENEW_SEC:
            return
        await self.hot_window.hold(self.shard, job_ids, self.config.held_ttl_sec, released=self._unhold)
        self._unhold = []
        self._held_renewed = now

    def waiting(self) -> bool:
        """Due work waits in the buffer (for room in its pool or under its tenant's quota), or the buffer is full:
        a pass takes more only once room is made."""
        return bool(len(self.queue)) or len(self.queue) + len(self.early) >= self.config.buffer_cap

    def next_look(self, now: datetime, lead: timedelta = timedelta(0)) -> datetime | None:
        """The earliest instant a pass may have work: ``now`` while due work waits in the buffer (for room), else
        the earliest of the window's first member (``lead`` before it is due: see :meth:`claim`) and the first
        occurrence claimed ahead (None: nothing).

        A window member further away than ``burst_ahead_sec`` is looked at that long before it is due, once: if a
        burst is due with it, that pass claims it ahead; if not, the next look is at the member's instant."""
        if len(self.queue):
            return now
        window = None if self._window_next is None else self._window_next - lead
        burst = timedelta(seconds=self.config.burst_ahead_sec)
        if window is not None and self.config.burst_ahead_min > 0 and window - now > burst:
            window -= burst
        candidates = [t for t in (window, self.early.first_due()) if t is not None]
        return min(candidates, default=None)

    def _uncontended(
        self,
        claimed: Claimed,
        now: datetime,
        due_by: datetime,
        tenants: dict[str, Tenant],
        pool_room: dict[str, int],
        default_room: int,
    ) -> bool:
        """Nothing due waits in the queue, and all that was claimed is due by ``due_by`` (now plus the publish lead)
        and fits this pass in any pool with what ``early`` holds due by now, under no quota. What waits in ``early``
        for an instant still to come (a burst claimed ahead, or members a contended pass claimed within the lead)
        does not make a pass contended: it would keep every later pass of a steady stream from sending ahead. Nor
        does what falls due there, if it fits and is no more than a burst's head: a contended pass keeps the
        members it claimed within the lead in ``early``, and the pass at their instant then found them due, was
        contended in turn and kept the next lead's members there, and so on. In W2's first seconds the pool's first
        cap (~90: ~11 for a shard's pass) made a pass of ~8 members contended now and then, and the stream then
        went out at each instant instead of ahead for ~8 s: 16-41 % of those seconds' executions were committed
        after their due instant (P95 +32 to +184 ms)."""
        # At most a burst head's worth: a burst claimed ahead still goes out head first (``burst_head``).
        head = self.config.burst_head or self.batch_size
        kept = self.early.due_count(now, head)
        n = len(claimed.jobs) + kept
        return (
            not len(self.queue)
            and kept <= head
            and all(o.due <= due_by for o in claimed.jobs)
            and n <= self.batch_size
            and n <= min(default_room, *pool_room.values())
            and not any(
                t.quotas.max_concurrent_executions is not None or t.quotas.max_dispatch_per_sec is not None
                for t in tenants.values()
            )
        )

    async def _put_back(self, claimed: Claimed) -> None:
        await self.hot_window.add(self.shard, claimed.jobs, only_new=True)
        await self.hot_window.add_retries(self.shard, claimed.retries, only_new=True)
        log.info("shard %d: failed pass put back %d claimed members", self.shard, len(claimed))

    async def release(self) -> int:
        """Put every held occurrence back into the hot window (ZADD NX), at its due time; how many.

        Called when the term ends, so the next leader finds them at once instead of after the hydrator's
        overdue scan. Best effort: if Redis is away the overdue scan still recovers them.
        """
        held = [w.occurrence for queue in self.queue.queues.values() for w in queue]
        held += [w.occurrence for w in self.early]
        self.forget()
        self.queue, self.early = FairQueue(), EarlyWork()
        for start in range(0, len(held), 5000):
            await self.hot_window.add(self.shard, held[start : start + 5000], only_new=True)
        await self.hot_window.drop_held(self.shard)
        return len(held)

    def forget(self) -> None:
        """The term is over: the other shards' passes stop deferring to what this buffer held."""
        if self.open_work.queues.get(self.shard) is self.queue:
            del self.open_work.queues[self.shard]

    async def _rate_limited(self, taken: list[Waiting], tenants: dict[str, Tenant]) -> list[Waiting]:
        """Apply ``maxDispatchPerSec``: a tenant's items beyond its tokens go back to the front of its queue."""
        by_tenant: dict[str, list[Waiting]] = {}
        for item in taken:
            by_tenant.setdefault(item.tenant, []).append(item)
        kept: list[Waiting] = []
        for tenant, items in by_tenant.items():
            quota = tenants[tenant].quotas.max_dispatch_per_sec if tenant in tenants else None
            granted = len(items)
            if quota is not None:
                try:
                    granted = (await self.buckets.take(f"dispatch:{tenant}", quota, len(items))).granted
                except (RedisError, OSError) as exc:  # the pass's own Redis calls will fail too; be loud once
                    log.warning("shard %d: dispatch-rate quota of %s not checked: %r", self.shard, tenant, exc)
            kept += items[:granted]
            self.queue.put_back(items[granted:])
        return kept
