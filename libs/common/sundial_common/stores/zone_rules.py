"""The zone-rules store: which time-zone rules each zone's stored next fires were computed with, and moving a
CRON job's next fire when they change (with its audit row), read and written by the hydrator."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol
from uuid import UUID

from sundial_common.stores.database import Database
from sundial_common.stores.queries import load_file
from sundial_common.stores.types import Record

Q = load_file("zone_rules.sql")


class ZoneRuleStore(Protocol):
    async def recorded(self) -> dict[str, str]:
        """Each zone's rules fingerprint as last recorded."""
        ...

    async def record(self, zone: str, fingerprint: str) -> None: ...

    async def zones_in_use(self) -> list[str]:
        """The zones of the CRON jobs that still fire."""
        ...

    async def scheduled_in_zone(self, zone: str) -> list[Record]:
        """The CRON jobs of ``zone`` that still fire, each with ``last_nominal``: its last run occurrence (or its
        creation instant)."""
        ...

    async def reschedule(
        self, job_id: UUID, was: datetime | None, nominal: datetime, fire_at: datetime, reason: str
    ) -> Record | None:
        """Move a job's next fire if it is still ``was``; its id, shard and state, or None if it moved meanwhile."""
        ...


class PostgresZoneRuleStore:
    def __init__(self, database: Database) -> None:
        self.pool = database.pool

    async def recorded(self) -> dict[str, str]:
        return {row["zone"]: row["fingerprint"] for row in await self.pool.fetch(Q["recorded"])}

    async def record(self, zone: str, fingerprint: str) -> None:
        await self.pool.execute(Q["record"], zone, fingerprint)

    async def zones_in_use(self) -> list[str]:
        return [row["timezone"] for row in await self.pool.fetch(Q["zones_in_use"])]

    async def scheduled_in_zone(self, zone: str) -> list[Record]:
        rows: list[Record] = await self.pool.fetch(Q["scheduled_in_zone"], zone)
        return rows

    async def reschedule(
        self, job_id: UUID, was: datetime | None, nominal: datetime, fire_at: datetime, reason: str
    ) -> Record | None:
        row: Record | None = await self.pool.fetchrow(Q["reschedule"], job_id, was, nominal, fire_at, reason)
        return row
