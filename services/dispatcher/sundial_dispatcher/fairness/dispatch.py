"""One shard leader's fair selection: claims due members into the buffer (ahead of a burst's instant), looks up
whose they are when the pass cannot send everything, and hands each pass its share under the pools' room and the
tenants' quotas (:mod:`sundial_dispatcher.fairness` explains the whole)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from uuid import UUID

from redis.exceptions import RedisError
from sundial_common.hotwindow.rate_limits import TokenBuckets
from sundial_common.hotwindow.window import Claimed, HotWindow
from sundial_common.stores.tenants import Tenant, TenantStore
from sundial_common.stores.types import Occurrence, RetryDue

from sundial_dispatcher.fairness.config import FairnessConfig
from sundial_dispatcher.fairness.pool_room import OpenWork
from sundial_dispatcher.fairness.queues import NOBODY, EarlyWork, FairQueue, Waiting
from sundial_dispatcher.tenancy import TenantPolicy

log = logging.getLogger(__name__)

#: How often a leader's held record is renewed while it claims nothing new (it lives ``held_ttl_sec``).
_HELD_RENEW_SEC = 1.0


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
        """This pass's work: up to ``batch_size`` occurrences and scheduled retries, taken fairly.

        A scheduled retry waits its turn in its tenant's queue like a job's occurrence (a re-drive's 100,000 retries
        are one tenant's work, not a queue jumped ahead of everyone's), under the same pool room and quotas. Only
        when and in which order it is committed changes: its commit is still the retry pass's fenced
        compare-and-swap, behind the breaker's gate (:mod:`sundial_dispatcher.retries`).

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
        #: First fires sent in this pass ahead of the queue (see below), and those of them ``early`` held.
        ahead: list[Occurrence] = []
        due: list[Waiting] = []
        try:
            tenants = await self.policy.tenants()
            await self.open_work.refresh()
            await self.open_work.registry.read(time.monotonic())
            pool_room, default_room = self.open_work.pool_room(self.shards, self.batch_size)
            # Read before first fires sent ahead are counted: in the round robin too they take the pools' room, not
            # the retries' share of it.
            retry_room = self.open_work.retry_room(default_room)
            if self._uncontended(claimed, now, due_by, tenants, pool_room, default_room):
                # Every first fire claimed goes out in this pass whoever it belongs to: the order within one pass
                # changes nothing, so the owners' lookup is skipped (the common case below saturation). So does
                # what an earlier, contended pass kept in ``early`` and is due now (see :meth:`_uncontended`).
                due = [w for arrival in self.early.pop_due(now) for w in arrival.items]
                self.open_work.took_unattributed(len(claimed.jobs))
                self.open_work.took(due)
                ahead = [w.occurrence for w in due] + claimed.jobs
                if not claimed.retries and not len(self.queue):
                    if due:
                        await self._release(due)
                    return Claimed(jobs=ahead)
                # Scheduled retries, claimed now or waiting for their own room, still take their turns in the
                # queue, in the room these first fires leave them.
                claimed = Claimed(retries=claimed.retries)
                pool_room, default_room = self.open_work.pool_room(self.shards, self.batch_size)
            if not self._held_cleared:  # what an earlier leader's buffer held is that leader's no more
                await self.hot_window.drop_held(self.shard)
                self._held_cleared = True
            if claimed.jobs:
                owners = await self.store.job_owners([o.job_id for o in claimed.jobs])
                waiting = [Waiting(o, *owners.get(o.job_id, (NOBODY, NOBODY, "NORMAL"))) for o in claimed.jobs]
                self.queue.add(w for w in waiting if w.occurrence.due <= now)
                self.early.push(w for w in waiting if w.occurrence.due > now)
            retries = [Occurrence(r.execution_id, r.due) for r in claimed.retries]
            if retries:
                # Never claimed ahead of the pass's lead: each queues at once (one due within the lead goes out
                # with its instant, as the retry pass sends it).
                owners = await self.store.retry_owners([o.job_id for o in retries])
                self.queue.add(
                    Waiting(o, *owners.get(o.job_id, (NOBODY, NOBODY, "NORMAL")), retry=True) for o in retries
                )
            buffered = True
            await self._hold([o.job_id for o in claimed.jobs] + [o.job_id for o in retries])
            budget = self.batch_size
            if self.early.due(now):
                if self.config.burst_head and not len(self.queue) and time.monotonic() - self._took_at > 1.0:
                    budget = min(budget, self.config.burst_head)  # a burst's first pass: its head only
                for arrival in self.early.pop_due(now):
                    self.queue.add_arrival(arrival)
            if not len(self.queue):
                if due:
                    await self._release(due)
                return Claimed(jobs=ahead)
            taken = self.queue.take(
                budget - len(ahead),
                weights={t.id: t.weight for t in tenants.values()},
                pool_room=pool_room,
                tenant_room=self.open_work.tenant_room(tenants),
                default_pool_room=default_room,
                elsewhere=self.open_work.best_lane_elsewhere(self.shard) if len(self.open_work.queues) > 1 else None,
                high_room=self.open_work.high_room(),
                retry_room=retry_room,
            )
            self.open_work.limited(self.queue.full_pools)
            taken = await self._rate_limited(taken, tenants)
        except BaseException:
            lost = Claimed(jobs=ahead) if buffered else Claimed(jobs=ahead + claimed.jobs, retries=claimed.retries)
            if lost:
                with contextlib.suppress(Exception):  # Redis away too: the hydrator's overdue scan recovers them
                    await asyncio.shield(self._put_back(lost))
            raise
        self.open_work.took(taken)
        self.cut_short = budget < self.batch_size and len(taken) == budget and bool(len(self.queue))
        if taken or ahead:
            self._took_at = time.monotonic()
        await self._release(due + taken)
        return Claimed(
            jobs=ahead + [w.occurrence for w in taken if not w.retry],
            retries=[RetryDue(w.occurrence.job_id, w.occurrence.due) for w in taken if w.retry],
        )

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
        """No job's occurrence waits in the queue, and every first fire claimed is due by ``due_by`` (now plus the
        publish lead) and fits this pass in any pool with what ``early`` holds due by now, under no quota. Scheduled
        retries, claimed or waiting in the queue, do not make the first fires contended: they have their own,
        smaller room, and the scheduled work takes the rest first (:meth:`OpenWork.retry_room`), so the first fires
        go out in this pass (ahead, if due within the lead) and the retries take their turns in the room left.
        Counted as contended, a bulk re-drive's retries waiting on its shard kept every first fire there from its
        publish lead: each was committed only after its due instant, by the next pass. What waits in ``early``
        for an instant still to come (a burst claimed ahead, or members a contended pass claimed within the lead)
        does not make a pass contended: it would keep every later pass of a steady stream from sending ahead. Nor
        does what falls due there, if it fits and is no more than a burst's head: a contended pass keeps the
        members it claimed within the lead in ``early``, and the pass at their instant then found them due, was
        contended in turn and kept the next lead's members there, and so on. In a 333/s spread's first seconds the
        pool's first cap (~90: ~11 for a shard's pass) made a pass of ~8 members contended now and then, and the stream
        then went out at each instant instead of ahead for ~8 s: 16-41 % of those seconds' executions were committed
        after their due instant (P95 +32 to +184 ms). Likewise a room of one a shard for a pool not seen at all made
        every pass of more than one member contended, a sparse stream's passes among them."""
        # At most a burst head's worth: a burst claimed ahead still goes out head first (``burst_head``).
        head = self.config.burst_head or self.batch_size
        kept = self.early.due_count(now, head)
        n = len(claimed.jobs) + kept
        return (
            self.queue.only_retries()
            and kept <= head
            and all(o.due <= due_by for o in claimed.jobs)
            and n <= self.batch_size
            and n <= min(pool_room.values(), default=default_room)
            # A pool not seen at all (nothing open, no live worker) has a share of the small first cap, often 1 a
            # shard: held to it, no pass of a steady stream of several members would be uncontended. A pass of at
            # most a burst head's worth may go out whole (such a pool then has that much queued, which the next
            # read of the counts sees); a larger one is looked up and ordered — unless every registered pool has
            # a room of its own above (no claimed job can be in a pool not seen): a dense stream's passes of ~32
            # were otherwise all looked up and held, one owners' query and two held-record round trips a pass.
            and (n <= max(default_room, head) or self.open_work.registry.all_seen(pool_room))
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
        waiting = [w for queue in self.queue.queues.values() for w in queue] + list(self.early)
        held = [w.occurrence for w in waiting if not w.retry]
        retries = [RetryDue(w.occurrence.job_id, w.occurrence.due) for w in waiting if w.retry]
        self.forget()
        self.queue, self.early = FairQueue(), EarlyWork()
        for start in range(0, len(held), 5000):
            await self.hot_window.add(self.shard, held[start : start + 5000], only_new=True)
        for start in range(0, len(retries), 5000):
            await self.hot_window.add_retries(self.shard, retries[start : start + 5000], only_new=True)
        await self.hot_window.drop_held(self.shard)
        return len(waiting)

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
