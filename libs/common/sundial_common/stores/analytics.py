"""The analytics store: the ``execution_events`` outbox that the analytics service drains into ClickHouse.

SQL: ``sql/analytics.sql``. The events are written by triggers on ``executions`` (migration 0010), in the
transaction of each state change, so no other store knows about them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol
from uuid import UUID

from sundial_common.queries import load_file
from sundial_common.stores.database import Database
from sundial_common.stores.types import Record

Q = load_file("analytics.sql")


class AnalyticsStore(Protocol):
    """The event outbox (read oldest, delete what was replicated)."""

    async def oldest_events(self, limit: int) -> list[Record]: ...

    async def delete_events(self, event_ids: Sequence[int]) -> int: ...

    async def pending_events(self) -> int: ...

    async def first_starts(self, execution_ids: Sequence[UUID]) -> dict[UUID, datetime]:
        """When attempt 1 of each of these executions started (those that have one)."""
        ...


class PostgresAnalyticsStore:
    """:class:`AnalyticsStore` over the shared pool."""

    def __init__(self, database: Database) -> None:
        self._pool = database.pool

    async def oldest_events(self, limit: int) -> list[Record]:
        return list(await self._pool.fetch(Q["oldest_events"], limit))

    async def delete_events(self, event_ids: Sequence[int]) -> int:
        if not event_ids:
            return 0
        status = await self._pool.execute(Q["delete_events"], list(event_ids))
        return int(status.rsplit(" ", 1)[1])

    async def pending_events(self) -> int:
        return int(await self._pool.fetchval(Q["pending_events"]))

    async def first_starts(self, execution_ids: Sequence[UUID]) -> dict[UUID, datetime]:
        if not execution_ids:
            return {}
        rows = await self._pool.fetch(Q["first_starts"], list(execution_ids))
        return {row["execution_id"]: row["started_at"] for row in rows}
