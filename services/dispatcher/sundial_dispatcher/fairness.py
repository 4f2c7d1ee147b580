"""Weighted fair dispatch: which due occurrences a shard's pass takes, across tenants, pools and quotas.

Without it a pass takes the earliest members of the hot window: tenant A's 50,000 jobs due at midnight are
all taken (and published) before tenant B's 100 due at the same instant, and B waits for A's whole burst.
Two mechanisms make B wait for nobody:

**A per-tenant buffer, served by deficit round robin.** Each pass claims due members from the hot window
into the leader's buffer (up to ``claim_size`` a pass, ``buffer_cap`` held), learns whose each job is (one
primary-key query), and queues it in its tenant's FIFO. The pass then takes up to ``batch_size`` occurrences
round-robin over the tenants with work, each round giving a tenant ``weight`` more turns (DRR): under
contention each tenant gets dispatch in proportion to its weight, and a tenant with little work is served at
once. Within a tenant work stays in due order (the priority issue orders it there, never across tenants).

**Short pool queues.** A Kafka topic is first in, first out: what is published behind a backlog waits for
it, whatever the dispatcher does later. So a pass publishes to a pool only while fewer than
``pool_queue_cap`` of its executions are PENDING (published, not started): the backlog waits here, where
the round robin can still put B's work first, rather than in the topic. The same count per tenant enforces
``maxConcurrentExecutions`` (beyond it the tenant's work waits, late but never lost), and a Redis token
bucket per tenant (shared by every shard leader) ``maxDispatchPerSec``.

Members in the buffer are out of Redis but not dispatched: a term that ends puts them back
(:meth:`FairDispatch.release`); if the leader dies instead, the jobs are still due in Postgres and the
hydrator's overdue scan puts them back (DESIGN invariant 1), as for any claimed member.
Scheduled retries pass straight through: they are executions already, their order is the hot window's.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from redis.exceptions import RedisError
from sundial_common.hotwindow import Claimed, HotWindow
from sundial_common.ratelimit import TokenBuckets
from sundial_common.stores.tenants import OpenExecutions, Tenant, TenantStore
from sundial_common.stores.types import Occurrence

from sundial_dispatcher.tenancy import TenantPolicy

log = logging.getLogger(__name__)

#: The tenant of a claimed member whose job is gone (deleted meanwhile): the dispatch store sorts it out.
_NOBODY = ""


@dataclass(frozen=True)
class FairnessConfig:
    #: Off (the default, ``SUNDIAL_DISPATCHER_FAIRNESS``): a pass takes the earliest due members, whoever they
    #: belong to (the behaviour before tenants).
    enabled: bool = False
    #: Most executions of one pool waiting in its topic (PENDING) before the passes stop publishing to it;
    #: each shard's pass may fill its share (1/shards) of the room left, so concurrent passes stay under it.
    pool_queue_cap: int = 1000
    #: Most claimed occurrences one shard leader holds waiting for their turn.
    buffer_cap: int = 200_000
    #: Members claimed from the hot window into the buffer per pass.
    claim_size: int = 2_000
    #: A PENDING execution dispatched longer ago than this no longer counts against its pool's queue: its
    #: message was lost (the broker restarted, a publish failed) and the sweeper sends it again; counted,
    #: such executions would stop the pool's dispatch until then.
    stale_queue_sec: float = 30.0

    def __post_init__(self) -> None:
        if self.pool_queue_cap < 1:
            raise ValueError("pool_queue_cap must be >= 1")
        if self.claim_size < 1 or self.buffer_cap < self.claim_size:
            raise ValueError("claim_size must be >= 1 and buffer_cap >= claim_size")


@dataclass(frozen=True, slots=True)
class Waiting:
    occurrence: Occurrence
    tenant: str
    pool: str


@dataclass
class FairQueue:
    """Per-tenant FIFOs of claimed occurrences and their round-robin deficits (pure: no I/O)."""

    queues: dict[str, deque[Waiting]] = field(default_factory=dict)
    deficits: dict[str, float] = field(default_factory=dict)
    #: Jobs held here. The hydrator's overdue scan re-adds a job that waits here past its grace to the hot
    #: window (it cannot tell held from lost); claimed again, it must not queue twice.
    held: set[UUID] = field(default_factory=set)
    #: Where the next round starts, so no tenant is always first.
    _turn: int = 0

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def add(self, items: Iterable[Waiting]) -> None:
        for item in items:
            if item.occurrence.job_id not in self.held:
                self.held.add(item.occurrence.job_id)
                self.queues.setdefault(item.tenant, deque()).append(item)

    def put_back(self, items: Sequence[Waiting]) -> None:
        """Return taken items to the front of their queues, in their order."""
        for item in reversed(items):
            self.held.add(item.occurrence.job_id)
            self.queues.setdefault(item.tenant, deque()).appendleft(item)

    def take(
        self,
        budget: int,
        weights: dict[str, int],
        pool_room: dict[str, int],
        tenant_room: dict[str, int],
        default_pool_room: int,
    ) -> list[Waiting]:
        """Up to ``budget`` items by weighted round robin; ``pool_room``/``tenant_room`` are used up as taken.

        A tenant whose next item's pool is full, or that has no room of its own, is passed over this pass.
        """
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
                    head = queue[0]
                    if tenant_room.get(tenant, budget) <= 0 or pool_room.get(head.pool, default_pool_room) <= 0:
                        break
                    queue.popleft()
                    self.held.discard(head.occurrence.job_id)
                    taken.append(head)
                    self.deficits[tenant] -= 1
                    pool_room[head.pool] = pool_room.get(head.pool, default_pool_room) - 1
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
        return taken


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
    ) -> None:
        self.shard = shard
        self.hot_window = hot_window
        self.store = store
        self.policy = policy
        self.buckets = buckets
        self.config = config
        self.batch_size = batch_size
        self.shards = shards
        self.queue = FairQueue()

    async def claim(self, now: datetime) -> Claimed:
        """This pass's work: scheduled retries as claimed, and up to ``batch_size`` occurrences taken fairly."""
        room = self.config.buffer_cap - len(self.queue)
        retries = []
        if room > 0:
            claimed = await self.hot_window.claim_due(self.shard, now, min(self.config.claim_size, room))
            retries = claimed.retries
            if claimed.jobs:
                owners = await self.store.job_owners([o.job_id for o in claimed.jobs])
                self.queue.add(Waiting(o, *owners.get(o.job_id, (_NOBODY, _NOBODY))) for o in claimed.jobs)
        if not len(self.queue):
            return Claimed(retries=retries)
        tenants = await self.policy.tenants()
        open_executions = await self.store.open_executions(self.config.stale_queue_sec)
        taken = self.queue.take(
            self.batch_size,
            weights={t.id: t.weight for t in tenants.values()},
            pool_room=self._pool_room(open_executions),
            tenant_room=self._tenant_room(tenants, open_executions),
            default_pool_room=self._share(self.config.pool_queue_cap),
        )
        taken = await self._rate_limited(taken, tenants)
        return Claimed(jobs=[w.occurrence for w in taken], retries=retries)

    async def release(self) -> int:
        """Put every held occurrence back into the hot window (ZADD NX), at its due time; how many.

        Called when the term ends, so the next leader finds them at once instead of after the hydrator's
        overdue scan. Best effort: if Redis is away the overdue scan still recovers them.
        """
        held = [w.occurrence for queue in self.queue.queues.values() for w in queue]
        self.queue = FairQueue()
        for start in range(0, len(held), 5000):
            await self.hot_window.add(self.shard, held[start : start + 5000], only_new=True)
        return len(held)

    def _share(self, room: int) -> int:
        """This shard's share of a pool's room: the shards' passes run at once and read the same count."""
        return -(-room // self.shards)

    def _pool_room(self, open_executions: Sequence[OpenExecutions]) -> dict[str, int]:
        pending: dict[str, int] = {}
        for row in open_executions:
            pending[row.pool] = pending.get(row.pool, 0) + row.pending
        room = {pool: self._share(max(0, self.config.pool_queue_cap - n)) for pool, n in pending.items()}
        room[_NOBODY] = self.batch_size  # jobs gone meanwhile: nothing will be published for them
        return room

    @staticmethod
    def _tenant_room(tenants: dict[str, Tenant], open_executions: Sequence[OpenExecutions]) -> dict[str, int]:
        """Room under ``maxConcurrentExecutions`` for the tenants that have the quota (others: absent)."""
        opened: dict[str, int] = {}
        for row in open_executions:
            opened[row.tenant_id] = opened.get(row.tenant_id, 0) + row.open
        return {
            t.id: max(0, t.quotas.max_concurrent_executions - opened.get(t.id, 0))
            for t in tenants.values()
            if t.quotas.max_concurrent_executions is not None
        }

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
