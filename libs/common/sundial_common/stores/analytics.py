"""The analytics store: the ``execution_events`` outbox that the analytics service drains into ClickHouse.

SQL: ``sql/analytics.sql``. The events are written by triggers on ``executions`` (migration 0010), in the
transaction of each state change, so no other store knows about them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from sundial_common.stores.database import Database
from sundial_common.stores.queries import load_file

Q = load_file("analytics.sql")


class AnalyticsStore(Protocol):
    """The event outbox (take the oldest, gone once replicated)."""

    async def take_events(self, limit: int, send: Callable[[bytes], Awaitable[None]]) -> int:
        """Hand up to ``limit`` of the oldest events to ``send`` as replica rows (tab-separated text, one
        line each, in :data:`sundial_analytics.replica.EVENT_COLUMNS` order) and delete them once it
        returns; if it raises, they stay queued. Returns how many were sent (0: ``send`` not called)."""
        ...

    async def pending_events(self) -> int: ...


class PostgresAnalyticsStore:
    """:class:`AnalyticsStore` over the shared pool."""

    def __init__(self, database: Database) -> None:
        self._pool = database.pool

    async def take_events(self, limit: int, send: Callable[[bytes], Awaitable[None]]) -> int:
        # One statement deletes the batch and formats it (COPY: bytes, not records: at thousands of events a
        # second, decoding and re-encoding each value in Python was most of the service's CPU); the
        # transaction stays open while ClickHouse inserts, so the delete commits only once the rows are there.
        chunks: list[bytes] = []

        async def collect(chunk: bytes) -> None:
            chunks.append(chunk)

        query = Q["take_events"].replace("{limit}", str(int(limit)))
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(Q["iso_dates"])
            status = await conn.copy_from_query(query, output=collect)
            taken = int(status.rsplit(" ", 1)[1])
            if taken:
                await send(b"".join(chunks))
        return taken

    async def pending_events(self) -> int:
        return int(await self._pool.fetchval(Q["pending_events"]))
