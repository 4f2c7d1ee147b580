"""Fair dispatch's limits for the executions a shard leader creates outside its dispatch pass.

Dependency children (:mod:`sundial_dispatcher.triggers`) and backfill occurrences
(:mod:`sundial_dispatcher.backfills`) are created in transactions of their own, not through the fair buffer
(:mod:`sundial_dispatcher.fairness`). They meet the same three limits as regular due work, read from the same
process-wide counts and buckets:

* **a pool's queue cap**: each shard's share of the room left in the pool (:meth:`OpenWork.pool_room`, a
  stalled pool's cap lifted as there), shared with that shard's dispatch pass;
* **maxConcurrentExecutions**: the tenant's open executions (:meth:`OpenWork.tenant_room`);
* **maxDispatchPerSec**: the tenant's token bucket ``dispatch:<tenant>``, the one its regular dispatch takes
  from, so children, backfills and scheduled fires share one rate.

A pass plans within the :class:`Room` read before its transaction (per pool and tenant, used up as it plans),
then takes the rate tokens of what it planned (:meth:`SideLimits.within_rate`) and drops what got none. What does not
fit waits where it is durable (a trigger stays pending, a backfill's cursor stays put): late, never lost. The
tenants and pools with no room at all are left out of the pass's scan (:meth:`Room.blocked_tenants`,
:meth:`Room.blocked_pools`), so a tenant at its quota does not fill the batch ahead of others that have room. What
a pass creates is counted in the process's counts at once (:meth:`SideLimits.took`), so the dispatch passes see
the room it used before the next read.

Not applied to them: the weighted round robin between tenants and priority order. A pass takes its children
(and backfills) oldest first within the room; they do not queue in the fair buffer behind or ahead of regular
work, each side takes the room it finds.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from redis.exceptions import RedisError
from sundial_common.hotwindow.rate_limits import TokenBuckets

from sundial_dispatcher.fairness import OpenWork
from sundial_dispatcher.tenancy import TenantPolicy


@dataclass
class Room:
    """What one pass may create now, per pool and per tenant (used up as it plans)."""

    #: Per pool seen: this shard's share of its queue's room. Others: ``default_pool``.
    pools: dict[str, int] = field(default_factory=dict)
    default_pool: int = sys.maxsize
    #: Per tenant with ``maxConcurrentExecutions``: its room. Others: unlimited.
    tenants: dict[str, int] = field(default_factory=dict)
    #: Tenants whose dispatch-rate bucket was found empty (their work is left out until it refills).
    empty: frozenset[str] = frozenset()
    #: Per tenant with ``maxDispatchPerSec``: its rate (read with the rest, so that the pass's transaction
    #: reads nothing more from Postgres).
    rates: dict[str, float] = field(default_factory=dict)
    #: Pools whose full queue held work back (reported to :meth:`OpenWork.limited`).
    full_pools: set[str] = field(default_factory=set)

    def available(self, tenant: str, pool: str) -> int:
        """How many executions of ``tenant`` in ``pool`` fit now."""
        pool_room = self.pools.get(pool, self.default_pool)
        if pool_room <= 0:
            self.full_pools.add(pool)
        if tenant in self.empty:
            return 0
        return max(0, min(pool_room, self.tenants.get(tenant, sys.maxsize)))

    def use(self, tenant: str, pool: str, n: int) -> None:
        self.pools[pool] = self.pools.get(pool, self.default_pool) - n
        if tenant in self.tenants:
            self.tenants[tenant] -= n

    def blocked_tenants(self) -> list[str]:
        """Tenants none of whose work fits this pass (at their concurrency quota, or their rate bucket empty)."""
        return sorted(self.empty | {t for t, n in self.tenants.items() if n <= 0})

    def blocked_pools(self) -> list[str]:
        """Pools whose queue has no room for this shard this pass."""
        return sorted(p for p, n in self.pools.items() if n <= 0)


class SideLimits:
    """The limits of one dispatcher process, as its children and backfills passes see them (shared by its shards)."""

    def __init__(
        self,
        policy: TenantPolicy,
        open_work: OpenWork,
        buckets: TokenBuckets,
        shards: int,
        batch_size: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.open_work = open_work
        self.buckets = buckets
        self.shards = shards
        self.batch_size = batch_size
        self.clock = clock
        #: Per tenant whose bucket granted less than asked: when its next token comes (``clock``).
        self._empty_until: dict[str, float] = {}

    async def room(self) -> Room:
        """The room now (the counts read again if older than ``counts_refresh_sec``)."""
        tenants = await self.policy.tenants()
        await self.open_work.refresh()
        pools, default_pool = self.open_work.pool_room(self.shards, self.batch_size)
        now = self.clock()
        self._empty_until = {t: until for t, until in self._empty_until.items() if until > now}
        rates = {
            t.id: t.quotas.max_dispatch_per_sec for t in tenants.values() if t.quotas.max_dispatch_per_sec is not None
        }
        return Room(pools, default_pool, self.open_work.tenant_room(tenants), frozenset(self._empty_until), rates)

    async def within_rate(self, room: Room, tenants: Sequence[str]) -> list[bool]:
        """For the executions a pass planned in ``room``, of ``tenants`` (in order): whether each got a token of its
        tenant's ``maxDispatchPerSec`` (a tenant's first ones do; one without the quota keeps all). Redis away: not
        checked, as in the dispatch pass (whose own calls fail too)."""
        granted: dict[str, int] = {}
        for tenant, n in Counter(tenants).items():
            quota = room.rates.get(tenant)
            if quota is None:
                continue
            try:
                grant = await self.buckets.take(f"dispatch:{tenant}", quota, n)
            except (RedisError, OSError):
                continue
            granted[tenant] = grant.granted
            if grant.granted < n:
                self._empty_until[tenant] = self.clock() + grant.retry_after_ms / 1000
        seen: Counter[str] = Counter()
        kept = []
        for tenant in tenants:
            seen[tenant] += 1
            kept.append(tenant not in granted or seen[tenant] <= granted[tenant])
        return kept

    def took(self, created: Iterable[tuple[str, str]], room: Room) -> None:
        """Count what a pass created ((tenant, pool) each) until the next read has it; note its full pools (those it
        found full, and those left out of its scan for it), so a pool whose workers keep up gets a larger cap at
        the next read, as when the dispatch pass holds work back."""
        self.open_work.took_executions(created)
        self.open_work.limited(room.full_pools | set(room.blocked_pools()))


class NoLimits:
    """Fair dispatch off: every child and backfill occurrence goes out as it comes (the :class:`SideLimits` calls,
    limiting nothing)."""

    async def room(self) -> Room:
        return Room()

    async def within_rate(self, room: Room, tenants: Sequence[str]) -> list[bool]:
        return [True] * len(tenants)

    def took(self, created: Iterable[tuple[str, str]], room: Room) -> None:
        pass


#: What a children or backfills pass runs within: the process's limits, or none.
Limits = SideLimits | NoLimits
