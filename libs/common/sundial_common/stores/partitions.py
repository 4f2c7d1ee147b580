"""The partition store: the daily partitions of ``executions`` and ``execution_attempts``, and of ``audit_log`` —
which exist, making the coming days' ahead of time, and dropping a day past retention once nothing in it must stay.

Both tables are ranged on the execution id (a UUIDv7, so on the instant the execution was created), one
partition per UTC day, ``executions_pYYYYMMDD`` and ``execution_attempts_pYYYYMMDD`` (migration 0018; the
tables an older database had became the ``_legacy`` partitions). The DDL runs in that migration's SQL
functions; SQL: ``sql/partitions.sql``. The sweeper's partition loop drives it
(:mod:`sundial_sweeper.partitions`).

``audit_log`` is ranged on ``at`` by UTC day, ``audit_log_pYYYYMMDD`` (migration 0020, with an ``audit_log_legacy``
partition likewise); nothing else refers to its rows, so a day past its retention simply goes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Protocol, TypeVar

import asyncpg

from sundial_common.domain.ids import id_time
from sundial_common.stores.database import Database
from sundial_common.stores.queries import load_file

Q = load_file("partitions.sql")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition of ``executions`` (its attempts' partition has the same suffix), or of ``audit_log``."""

    name: str
    #: Where its range ends: every execution in it was created before this instant.
    ends_at: datetime


class PartitionStore(Protocol):
    async def partitions(self) -> list[Partition]:
        """Every partition of ``executions``, oldest first."""
        ...

    async def executions_begin(self) -> datetime | None:
        """When the oldest partition of ``executions`` left begins: no execution created before it remains.
        None if a partition has no lower bound (an upgraded database's legacy partition)."""
        ...

    async def add_partitions(self, first_day: date, days: int, lock_timeout_ms: int) -> int | None:
        """Make the partitions of ``days`` UTC days from ``first_day`` that do not exist; how many were made.

        None: the parent's lock was not had within ``lock_timeout_ms`` (nothing changed).
        """
        ...

    async def drop_partition(self, name: str, lock_timeout_ms: int) -> bool | None:
        """Drop one partition (and its attempts') unless it holds what must stay; whether it was dropped.

        None: the parents' locks were not had within ``lock_timeout_ms`` (nothing changed).
        """
        ...

    async def audit_partitions(self) -> list[Partition]:
        """Every partition of ``audit_log``, oldest first."""
        ...

    async def add_audit_partitions(self, first_day: date, days: int, lock_timeout_ms: int) -> int | None:
        """:meth:`add_partitions` for ``audit_log``."""
        ...

    async def drop_audit_partition(self, name: str, lock_timeout_ms: int) -> bool | None:
        """Drop one partition of ``audit_log``; False if it is none. None: its lock was not had in time."""
        ...


class PostgresPartitionStore:
    """:class:`PartitionStore` over the shared pool; each change is its own short transaction."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def partitions(self) -> list[Partition]:
        rows = await self._db.pool.fetch(Q["executions_partitions"])
        found = []
        for row in rows:
            ends_at = id_time(row["upper_id"]) if row["upper_id"] is not None else None
            if ends_at is not None:
                found.append(Partition(name=row["name"], ends_at=ends_at))
        return found

    async def executions_begin(self) -> datetime | None:
        lower_id = await self._db.pool.fetchval(Q["executions_begin"])
        return id_time(lower_id) if lower_id is not None else None

    async def add_partitions(self, first_day: date, days: int, lock_timeout_ms: int) -> int | None:
        return await self._locked(int, Q["add_partitions"], lock_timeout_ms, first_day, days)

    async def drop_partition(self, name: str, lock_timeout_ms: int) -> bool | None:
        return await self._locked(bool, Q["drop_partition"], lock_timeout_ms, name)

    async def audit_partitions(self) -> list[Partition]:
        rows = await self._db.pool.fetch(Q["audit_partitions"])
        return [Partition(name=row["name"], ends_at=row["ends_at"]) for row in rows]

    async def add_audit_partitions(self, first_day: date, days: int, lock_timeout_ms: int) -> int | None:
        return await self._locked(int, Q["add_audit_partitions"], lock_timeout_ms, first_day, days)

    async def drop_audit_partition(self, name: str, lock_timeout_ms: int) -> bool | None:
        return await self._locked(bool, Q["drop_audit_partition"], lock_timeout_ms, name)

    async def _locked(self, result: Callable[[Any], T], query: str, lock_timeout_ms: int, *args: object) -> T | None:
        """One DDL function's call (its value as ``result``) in a transaction that waits at most
        ``lock_timeout_ms`` for a lock; None if it did not get it (nothing changed)."""
        try:
            async with self._db.pool.acquire() as conn, conn.transaction():
                await conn.execute(Q["lock_timeout"], f"{lock_timeout_ms}ms")
                return result(await conn.fetchval(query, *args))
        except asyncpg.LockNotAvailableError:
            return None
