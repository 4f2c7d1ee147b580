"""The sweeper's sample of each pool's service: ``sundial_pool_live_workers``, ``…_pending_executions``, ``…_unserved``.

Every pool with live workers (their announcements in Redis) or work waiting (PENDING executions in Postgres) gets a
series of each; ``sundial_pool_unserved`` is 1 while the pool has work and no live worker — the one definition of
:mod:`sundial_common.coordination.pool_service`, which the alert ``SundialPoolWithoutWorker`` reads. Sampled by the
active sweeper only, with its other gauges; a sweeper without Redis samples nothing here.
"""

from __future__ import annotations

import logging

from prometheus_client import Gauge
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sundial_common.coordination.pool_service import PendingWork, pools_service
from sundial_common.hotwindow.worker_announcements import WorkerAnnouncements
from sundial_common.observability.metrics import POOL_LIVE_WORKERS, POOL_PENDING, POOL_UNSERVED, Children

log = logging.getLogger("sundial.sweeper")


class PoolGauges:
    """Sets the pools' gauges from one reading of the announcements and the backlog; forgets them on demand."""

    def __init__(self, redis: Redis | None, pending: PendingWork) -> None:
        self._announcements = WorkerAnnouncements(redis) if redis is not None else None
        self._pending = pending
        self._live: Children[Gauge] = Children(POOL_LIVE_WORKERS)
        self._waiting: Children[Gauge] = Children(POOL_PENDING)
        self._unserved: Children[Gauge] = Children(POOL_UNSERVED)

    async def sample(self) -> None:
        if self._announcements is None:
            return
        try:
            pools = await pools_service(self._announcements, self._pending, ())
        except (RedisError, OSError) as exc:
            log.warning("pools' live workers not sampled: %r", exc)
            return
        self.forget(keep=[(name,) for name in pools])
        for name, service in pools.items():
            self._live(name).set(service.live_workers)
            self._waiting(name).set(service.pending)
            self._unserved(name).set(1 if service.unserved else 0)

    def forget(self, keep: list[tuple[str, ...]] | None = None) -> None:
        """Remove the series (of pools not in ``keep``): a sweeper that stopped leading reports none."""
        for gauge in (self._live, self._waiting, self._unserved):
            gauge.forget(keep or ())
