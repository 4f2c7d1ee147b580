"""Whether a pool's work will be picked up: its live workers (Redis announcements) beside its backlog (Postgres).

This module holds the one definition of **"a pool has work and no live worker"** (:attr:`PoolService.unserved`):
at least one execution of the pool is PENDING (dispatched, waiting to start) and no worker of the pool has
announced itself within its TTL (:mod:`sundial_common.hotwindow.worker_announcements`). The API's pool view and an
execution's ``waitingFor``, the sweeper's ``sundial_pool_unserved`` gauge (and its alert), and later the
dispatcher's queue bound and notifications all use it, so they never disagree about what "nobody is listening"
means. It also words the warnings a job gets when nothing would run it (:func:`handler_warning`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from sundial_common.hotwindow.worker_announcements import WorkerAnnouncement

__all__ = ["PendingWork", "PoolService", "handler_warning", "pool_service", "pools_service", "waiting_for"]


class PendingWork(Protocol):
    """The backlog's source (:meth:`sundial_common.stores.executions.PostgresExecutionStore.pending_by_pool`)."""

    async def pending_by_pool(
        self, tenant_id: str | None = None, pool: str | None = None
    ) -> dict[str, tuple[int, datetime]]: ...


class LiveWorkers(Protocol):
    """The announcements' source (:class:`~sundial_common.hotwindow.worker_announcements.WorkerAnnouncements`)."""

    async def live_pools(self, pools: Sequence[str] | None = None) -> dict[str, list[WorkerAnnouncement]]: ...


@dataclass(frozen=True, slots=True)
class PoolService:
    """A pool's live workers and its backlog (one tenant's, when read for a tenant)."""

    pool: str
    workers: tuple[WorkerAnnouncement, ...]
    #: Executions waiting for a worker (PENDING).
    pending: int
    #: Creation of the oldest of them; None without any.
    oldest_pending_at: datetime | None

    @property
    def live_workers(self) -> int:
        return len(self.workers)

    @property
    def free_slots(self) -> int:
        return sum(w.free_slots for w in self.workers)

    @property
    def handlers(self) -> tuple[str, ...]:
        """Every handler some live worker serves, sorted."""
        return tuple(sorted({h for w in self.workers for h in w.handlers}))

    @property
    def unserved(self) -> bool:
        """The pool has work and no live worker: its PENDING executions wait for a worker that is not there."""
        return self.pending > 0 and not self.workers


def waiting_for(pool: str, workers: Sequence[WorkerAnnouncement]) -> str | None:
    """What a PENDING execution of ``pool`` waits for when nothing can start it (no live worker), else None."""
    return None if workers else f"no live worker in pool {pool}"


def handler_warning(pool: str, handler: str, workers: Sequence[WorkerAnnouncement]) -> str | None:
    """Why a job naming ``handler`` in ``pool`` would not run with today's workers, or None if one serves it."""
    if not workers:
        return (
            f"no live worker reads pool `{pool}`: the job's executions will wait (PENDING) until a worker of the pool "
            "starts (`sundial worker --app module:worker`)"
        )
    # A worker that names no handler (one pulling through the worker gateway without saying) may serve any.
    if any(handler in w.handlers or not w.handlers for w in workers):
        return None
    served = sorted({h for w in workers for h in w.handlers})
    return (
        f"no live worker of pool `{pool}` serves handler `{handler}` (they serve: {', '.join(served) or 'none'}): "
        "its executions will fail with UnknownHandler unless a worker with that handler starts first"
    )


async def pool_service(live: LiveWorkers, pending: PendingWork, pool: str, tenant_id: str | None) -> PoolService:
    """``pool``'s live workers and backlog (``tenant_id``'s own only, when given: a shared pool's other tenants'
    work is not theirs to see)."""
    workers = (await live.live_pools([pool])).get(pool, [])
    count, oldest = (await pending.pending_by_pool(tenant_id, pool)).get(pool, (0, None))
    return PoolService(pool, tuple(workers), count, oldest)


async def pools_service(live: LiveWorkers, pending: PendingWork, pools: Sequence[str]) -> dict[str, PoolService]:
    """Every pool of ``pools``, and every pool with live workers or a backlog, by name (every tenant's work)."""
    workers = await live.live_pools()
    backlog = await pending.pending_by_pool()
    found: dict[str, PoolService] = {}
    for name in sorted({*pools, *workers, *backlog}):
        count, oldest = backlog[name] if name in backlog else (0, None)
        found[name] = PoolService(name, tuple(workers.get(name, ())), count, oldest)
    return found
