"""The fair buffer, pure (no I/O): per-tenant queues in priority lanes served by weighted deficit round robin, and the
occurrences claimed ahead of their due instant."""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from sundial_common.stores.types import Occurrence

#: The tenant (and pool) of a claimed member whose job is gone (deleted meanwhile): the dispatch store sorts it out.
NOBODY = ""

#: Priorities, highest first: a tenant's queue serves its lanes in this order.
PRIORITIES = ("HIGH", "NORMAL", "LOW")
_LANE = {p: i for i, p in enumerate(PRIORITIES)}


@dataclass(frozen=True, slots=True)
class Waiting:
    """A claimed member waiting its turn: a job's occurrence, or (``retry``) a scheduled retry, whose
    ``occurrence`` then names the execution (its id in ``job_id``) and when the retry is due."""

    occurrence: Occurrence
    tenant: str
    pool: str
    priority: str = "NORMAL"
    retry: bool = False


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
    #: Jobs (and retries' executions) held here. The hydrator's overdue scan re-adds a job that waits here past its
    #: grace to the hot window if the held record has lapsed; claimed again, it must not queue twice.
    held: set[UUID] = field(default_factory=set)
    #: One take in this many of a tenant's goes to its longest-waiting work whatever its priority.
    oldest_every: int = 10
    #: The pools whose full queue held a tenant's next item back in the last :meth:`take`.
    full_pools: set[str] = field(default_factory=set)
    #: How many of the items held here are scheduled retries (:meth:`only_retries`).
    retries: int = 0
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

    def only_retries(self) -> bool:
        """Everything waiting here (if anything) is a scheduled retry: no job's occurrence waits for its turn."""
        return self.retries == len(self)

    def add(self, items: Iterable[Waiting]) -> None:
        for item in items:
            if item.occurrence.job_id not in self.held:
                self.held.add(item.occurrence.job_id)
                self._queue(item.tenant).append(item)
                self._count(item, 1)
                self.retries += item.retry

    def add_arrival(self, arrival: Arrival) -> None:
        """Queue the occurrences of one claim that fell due at one instant (:class:`Arrival`), in their order.

        A burst claimed ahead is thousands of them at once (100,000 at once: 12,500 a shard); queued one by one at its
        due instant, in each of the four shards a process leads, they held the burst's first transaction back (see
        :class:`EarlyWork`). None of them held yet (the usual case): each tenant lane takes its run in one step.
        Otherwise (one was claimed again meanwhile) one by one, as :meth:`add`, so none is queued twice."""
        if not self.held.isdisjoint(arrival.jobs):
            self.add(arrival.items)
            return
        self.held.update(arrival.jobs)
        self.retries += arrival.retries
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
            self.retries += item.retry

    def take(
        self,
        budget: int,
        weights: dict[str, int],
        pool_room: dict[str, int],
        tenant_room: dict[str, int],
        default_pool_room: int,
        elsewhere: Callable[[str, str], int] | None = None,
        high_room: dict[str, int] | None = None,
        retry_room: dict[str, int] | None = None,
    ) -> list[Waiting]:
        """Up to ``budget`` items by weighted round robin; ``pool_room``/``tenant_room`` are used up as taken.

        A tenant whose next item's pool is full, or that has no room of its own, is passed over this pass.
        ``elsewhere(tenant, pool)``: the best lane the tenant has waiting for the pool in the other queues of
        this process (the other shards it leads); a priority pick of a lower lane yields to it this pass, so
        the pool's room goes to the tenant's higher-priority work whichever shard holds it (the turn of the
        oldest never yields: that is the no-starvation share). ``high_room``: per pool, the room ``HIGH`` work
        has beyond a full pool (:meth:`OpenWork.high_room`), used up by every ``HIGH`` item taken. ``retry_room``:
        per pool, the room scheduled retries have (:meth:`OpenWork.retry_room`; a pool absent: the room under
        :data:`NOBODY`).
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
                    if head.retry and retry_room is not None:
                        if retry_room.setdefault(head.pool, retry_room.get(NOBODY, default_pool_room)) <= 0:
                            break  # the rest of the pool's queue is the scheduled work's
                    if (
                        elsewhere is not None
                        and head.priority != PRIORITIES[0]
                        and not queue.oldest_turn()
                        and elsewhere(tenant, head.pool) < _LANE.get(head.priority, 1)
                    ):
                        break  # its higher-priority work in another shard's queue goes first
                    queue.popleft()
                    self._count(head, -1)
                    self.retries -= head.retry
                    self.held.discard(head.occurrence.job_id)
                    taken.append(head)
                    self.deficits[tenant] -= 1
                    pool_room[head.pool] = pool_room.get(head.pool, default_pool_room) - 1
                    if high and head.pool in high_room:
                        high_room[head.pool] -= 1
                    if head.retry and retry_room is not None:
                        retry_room[head.pool] -= 1
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
    #: How many are scheduled retries (none, as retries are never claimed ahead; counted all the same).
    retries: int = 0

    def append(self, item: Waiting) -> None:
        lane = _LANE.get(item.priority, 1)
        self.items.append(item)
        self.retries += item.retry
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
    leads four), all before the burst's first transaction could begin (``bench/workloads/first_start.py``)."""

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
