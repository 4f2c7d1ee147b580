"""The ``pool.unserved`` and ``pool.served`` incidents: a pool's work waits for a worker that is not there.

"A pool has work and no live worker" has one definition
(:attr:`sundial_common.coordination.pool_service.PoolService.unserved`: PENDING executions and no worker
announced within its TTL), the one the API's ``waitingFor`` and the ``sundial_pool_unserved`` gauge use. Here it
is judged per tenant: a shared pool's episode is told to each tenant whose work waits in it.

An **episode** starts when the condition has held for ``grace_sec`` (a Redis that restarted empty forgets every
announcement for one heartbeat interval; a worker restarting takes a few seconds) and ends when a worker of the
pool is live again — not when the backlog empties some other way (cancelled), since nothing would run the next
execution either. Redis forgets, so the episode is kept in Postgres (``pool_episodes``): opening and closing it
are compare-and-sets that record their incident in the same transaction
(:meth:`~sundial_common.stores.notifications.NotificationStore.open_pool_episode`), so an episode is told once
however many sweepers judge it. The grace is counted in this process's memory: a sweeper that takes over starts
it again, which delays an episode's start by at most one grace, never tells it twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from redis.exceptions import RedisError
from sundial_common.coordination.pool_service import LiveWorkers, PoolService
from sundial_common.stores.notifications import NotificationStore

log = logging.getLogger("sundial.sweeper")


@dataclass(frozen=True)
class PoolEpisodesConfig:
    """``grace_sec``: how long a pool must have work and no live worker before its episode starts;
    ``interval_sec``: between passes."""

    grace_sec: float = 60.0
    interval_sec: float = 15.0

    def __post_init__(self) -> None:
        if self.grace_sec < 0 or self.interval_sec <= 0:
            raise ValueError("grace_sec must be >= 0 and interval_sec > 0")


@dataclass(frozen=True)
class PoolEpisodesPass:
    opened: int = 0
    closed: int = 0


class PoolEpisodes:
    """Opens and closes the subscribed tenants' pool episodes (one pass: :meth:`run_once`)."""

    def __init__(
        self,
        store: NotificationStore,
        workers: LiveWorkers | None,
        config: PoolEpisodesConfig,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.workers = workers
        self.config = config
        self._monotonic = monotonic
        #: (tenant, pool) → when this process first saw it unserved, since it last saw it served.
        self._unserved_from: dict[tuple[str, str], float] = {}

    async def run_once(self) -> PoolEpisodesPass:
        if self.workers is None:
            return PoolEpisodesPass()
        rows = await self.store.pool_backlogs()
        if not rows:
            self._unserved_from.clear()
            return PoolEpisodesPass()
        pools: Sequence[str] = sorted({r["pool"] for r in rows})
        try:
            live = await self.workers.live_pools(pools)
        except (RedisError, OSError) as exc:  # no reading of the workers: nothing is judged
            log.warning("pool episodes not judged: %r", exc)
            return PoolEpisodesPass()
        now = self._monotonic()
        opened = closed = 0
        seen: set[tuple[str, str]] = set()
        for row in rows:
            key = (row["tenant_id"], row["pool"])
            seen.add(key)
            service = PoolService(row["pool"], tuple(live.get(row["pool"], ())), int(row["pending"]), None)
            if service.unserved and not row["open"]:
                since = self._unserved_from.setdefault(key, now)
                if now - since >= self.config.grace_sec:
                    detail = {"pending": service.pending, "liveWorkers": 0}
                    if await self.store.open_pool_episode(*key, detail) is not None:
                        opened += 1
            elif not service.unserved:
                self._unserved_from.pop(key, None)
                if row["open"] and service.live_workers > 0:
                    detail = {"pending": service.pending, "liveWorkers": service.live_workers}
                    if await self.store.close_pool_episode(*key, detail) is not None:
                        closed += 1
        for key in set(self._unserved_from) - seen:
            del self._unserved_from[key]
        return PoolEpisodesPass(opened=opened, closed=closed)
