"""The backfill store: durable backfills of a recurring job's past range, from the API's request to the
executions the job's shard leader creates for them.

``POST /v1/jobs/{id}:backfill`` writes one ``backfills`` row (:meth:`PostgresBackfillStore.create`) with the
number of occurrences of the range that have no execution yet. The leader of the job's shard then steps
each running backfill in one fenced transaction (:meth:`PostgresBackfillStore.step`, a :class:`BackfillStep`
whose transaction commits when the ``async with`` block ends): it raises the shard's fence and locks the running
backfills (:attr:`BackfillStep.running`); the leader plans the next occurrences within each one's rate budget
and has the step insert their executions (:meth:`BackfillStep.create`: ``(job_id, scheduled_for)`` unique, an
occurrence that has an execution gets no second one) and move the cursors (:meth:`BackfillStep.advance`) — all
or nothing, so a leader killed mid-backfill is resumed by the next one exactly where the last commit left off.

SQL: ``sql/backfills.sql``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, cast
from uuid import UUID

import asyncpg

from sundial_common.stores import dispatch
from sundial_common.stores.database import Database
from sundial_common.stores.queries import load_file
from sundial_common.stores.types import Record

Q = load_file("backfills.sql")


@dataclass(frozen=True, slots=True)
class NewBackfill:
    id: UUID
    tenant_id: str
    job_id: UUID
    shard: int
    range_from: datetime
    range_to: datetime
    overlap_policy: str
    rate_per_sec: float
    total: int
    actor: str
    traceparent: str | None = None


@dataclass(frozen=True, slots=True)
class BackfillExecution:
    execution_id: UUID
    backfill: Record
    scheduled_for: datetime
    max_attempts: int
    trace_id: str | None
    traceparent: str | None


@dataclass(frozen=True, slots=True)
class BackfillAdvance:
    backfill_id: UUID
    cursor_at: datetime | None
    created: int
    done: bool


@dataclass
class BackfillPlan:
    executions: list[BackfillExecution] = field(default_factory=list)
    advances: list[BackfillAdvance] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class BackfillOutcome:
    created: list[BackfillExecution]
    plan: BackfillPlan


class BackfillStore(Protocol):
    async def create(self, backfill: NewBackfill) -> Record: ...

    async def get(self, tenant_id: str, backfill_id: UUID) -> Record | None: ...

    async def cancel(self, tenant_id: str, backfill_id: UUID, actor: str) -> Record | None: ...

    async def of_job(self, tenant_id: str, job_id: UUID, before: UUID | None, limit: int) -> list[Record]: ...

    async def existing_occurrences(self, job_id: UUID, start: datetime, end: datetime) -> set[datetime]: ...

    async def has_running(self, shard: int) -> bool: ...

    def step(
        self,
        shard: int,
        token: int,
        holder: str,
        limit: int,
        *,
        skip_tenants: Sequence[str] = (),
        skip_pools: Sequence[str] = (),
    ) -> AbstractAsyncContextManager[BackfillStep]: ...


class BackfillStep:
    """One fenced backfill transaction, open for the ``async with`` block of :meth:`PostgresBackfillStore.step`:
    the running backfills it locked, and the writes of the step. It commits when the block ends (rolls back if
    the block raises)."""

    def __init__(self, conn: asyncpg.Connection, shard: int, token: int, holder: str, running: Sequence[Record]):
        self._conn = conn
        self._shard = shard
        self._token = token
        self._holder = holder
        #: The shard's running backfills with their job, locked for the transaction (a cancel waits for it).
        self.running = running

    async def create(self, planned: Sequence[BackfillExecution]) -> list[BackfillExecution]:
        """Insert the planned executions; those created (an occurrence that already had one is left alone)."""
        if not planned:
            return []
        rows = await self._conn.fetch(
            Q["insert_backfill_executions"],
            [p.execution_id for p in planned],
            [p.backfill["tenant_id"] for p in planned],
            [p.backfill["job_id"] for p in planned],
            [p.scheduled_for for p in planned],
            [p.backfill["pool"] for p in planned],
            [p.backfill["handler"] for p in planned],
            [p.max_attempts for p in planned],
            [p.backfill["timeout_sec"] for p in planned],
            self._shard,
            self._token,
            [p.trace_id for p in planned],
            [p.traceparent for p in planned],
            [p.backfill["id"] for p in planned],
            self._holder,
        )
        inserted = {row["id"] for row in rows}
        return [p for p in planned if p.execution_id in inserted]

    async def advance(self, advances: Sequence[BackfillAdvance], created: Sequence[BackfillExecution]) -> None:
        """Move each stepped backfill's cursor, counting what ``created`` holds of it."""
        if not advances:
            return
        per_backfill: dict[UUID, int] = {}
        for p in created:
            per_backfill[p.backfill["id"]] = per_backfill.get(p.backfill["id"], 0) + 1
        await self._conn.execute(
            Q["advance_backfills"],
            [a.backfill_id for a in advances],
            [a.cursor_at for a in advances],
            [per_backfill.get(a.backfill_id, 0) for a in advances],
            [a.done for a in advances],
        )


class PostgresBackfillStore:
    """:class:`BackfillStore` over the shared pool."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, backfill: NewBackfill) -> Record:
        """The backfill row (DONE at once when nothing is missing) and its audit row."""
        b = backfill
        row = await self._db.pool.fetchrow(
            Q["insert_backfill"],
            b.id,
            b.tenant_id,
            b.job_id,
            b.shard,
            b.range_from,
            b.range_to,
            b.overlap_policy,
            b.rate_per_sec,
            b.total,
            b.actor,
            b.traceparent,
        )
        assert row is not None
        return await self.get(b.tenant_id, b.id) or cast(Record, row)

    async def get(self, tenant_id: str, backfill_id: UUID) -> Record | None:
        """The backfill with ``finished`` (its executions that ended), or None (unknown or another tenant's)."""
        return cast(Record | None, await self._db.pool.fetchrow(Q["get_backfill"], backfill_id, tenant_id))

    async def cancel(self, tenant_id: str, backfill_id: UUID, actor: str) -> Record | None:
        """RUNNING → CANCELLED: no more executions are created (those created run on). None: not RUNNING."""
        row = await self._db.pool.fetchrow(Q["cancel_backfill"], backfill_id, tenant_id, actor)
        return None if row is None else await self.get(tenant_id, backfill_id)

    async def of_job(self, tenant_id: str, job_id: UUID, before: UUID | None, limit: int) -> list[Record]:
        """The job's backfills (with ``finished``), newest first, older than ``before`` if given."""
        return cast(list[Record], await self._db.pool.fetch(Q["job_backfills"], job_id, tenant_id, before, limit))

    async def existing_occurrences(self, job_id: UUID, start: datetime, end: datetime) -> set[datetime]:
        rows = await self._db.pool.fetch(Q["existing_occurrences"], job_id, start, end)
        return {row["scheduled_for"] for row in rows}

    async def has_running(self, shard: int) -> bool:
        """Before the fenced transaction (a write): has ``shard`` a running backfill of a tenant not SUSPENDED?"""
        return bool(await self._db.pool.fetchval(Q["any_running"], shard))

    @asynccontextmanager
    async def step(
        self,
        shard: int,
        token: int,
        holder: str,
        limit: int,
        *,
        skip_tenants: Sequence[str] = (),
        skip_pools: Sequence[str] = (),
    ) -> AsyncIterator[BackfillStep]:
        """The fenced backfill transaction (see the module docstring): not a SUSPENDED tenant's backfills, nor
        those of ``skip_tenants`` or in ``skip_pools``. Raises ``FencedOut`` like a dispatch."""
        async with self._db.pool.acquire() as conn, conn.transaction():
            if await conn.fetchval(dispatch.Q["raise_fence"], shard, token, holder) is None:
                raise dispatch.FencedOut(shard, token)
            running = await conn.fetch(Q["running_backfills"], shard, limit, list(skip_tenants), list(skip_pools))
            yield BackfillStep(conn, shard, token, holder, running)
