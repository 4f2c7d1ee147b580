"""The workers store: each worker identity's incarnations, and the attempts an earlier incarnation left RUNNING.

A worker process takes the next incarnation of its identity when it starts (:meth:`WorkerStore.begin_incarnation`),
before it consumes anything; the RUNNING attempts its identity holds that started before that moment
(:meth:`WorkerStore.orphaned_attempts`) were an earlier incarnation's, whose handlers died with it. Ending them is
the executions store's compare-and-swap (:meth:`~sundial_common.stores.executions.ExecutionStore.fail_running`),
the sweeper's own. SQL: ``sql/workers.sql``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, cast

from sundial_common.stores.database import Database
from sundial_common.stores.queries import load_file
from sundial_common.stores.types import Record

Q = load_file("workers.sql")


@dataclass(frozen=True, slots=True)
class Incarnation:
    """One life of a worker identity: its number (1, 2, …) and when it began, by the database's clock."""

    worker_id: str
    number: int
    started_at: datetime


class WorkerStore(Protocol):
    async def begin_incarnation(self, worker_id: str, pool: str, host: str, pid: int) -> Incarnation:
        """Take the next incarnation of ``worker_id``."""
        ...

    async def orphaned_attempts(self, incarnation: Incarnation, limit: int) -> list[Record]:
        """RUNNING attempts of this identity that started before ``incarnation`` began (oldest first)."""
        ...


class PostgresWorkerStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def begin_incarnation(self, worker_id: str, pool: str, host: str, pid: int) -> Incarnation:
        row = await self._db.pool.fetchrow(Q["begin_incarnation"], worker_id, pool, host, pid)
        assert row is not None  # an upsert always returns its row
        return Incarnation(worker_id=row["worker_id"], number=row["incarnation"], started_at=row["started_at"])

    async def orphaned_attempts(self, incarnation: Incarnation, limit: int) -> list[Record]:
        return cast(
            list[Record],
            await self._db.pool.fetch(Q["orphaned_attempts"], incarnation.worker_id, incarnation.started_at, limit),
        )
