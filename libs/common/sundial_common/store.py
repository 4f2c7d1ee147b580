"""The Postgres store: the only source of truth (DESIGN invariant 1).

Every database call a Sundial process makes goes through :class:`Store`; the SQL itself lives in
``sql/queries.sql``. Batches are one round trip each (arrays through ``unnest``), and asyncpg
prepares and caches every statement, so hot paths pay no parse cost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeAlias, cast
from uuid import UUID

import asyncpg
import orjson

from sundial_common.queries import Q

#: A row as asyncpg returns it (read by column name).
Record: TypeAlias = Mapping[str, Any]


class FencedOut(Exception):
    """A newer leader has written for this shard: the caller's term is over."""

    def __init__(self, shard: int, token: int) -> None:
        super().__init__(f"shard {shard}: token {token} is fenced out by a newer leader")
        self.shard = shard
        self.token = token


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One due fire of a job, as claimed from the hot window."""

    job_id: UUID
    due: datetime


@dataclass(frozen=True, slots=True)
class PlannedExecution:
    """What the dispatcher decided for one locked due job: the execution to create and the job's next fire."""

    execution_id: UUID
    job: Record
    next_fire_at: datetime | None
    max_attempts: int
    trace_id: str | None
    traceparent: str | None


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one attempt ended, as the worker reports it."""

    execution_id: UUID
    attempt: int
    state: str
    result: Any = None
    error: str | None = None


async def _init_connection(conn: asyncpg.Connection) -> None:
    # jsonb in binary format is a version byte followed by the JSON text; orjson does the rest.
    await conn.set_type_codec(
        "jsonb",
        schema="pg_catalog",
        encoder=lambda value: b"\x01" + orjson.dumps(value),
        decoder=lambda data: orjson.loads(data[1:]),
        format="binary",
    )


async def _keep_session(conn: asyncpg.Connection) -> None:
    # Called instead of asyncpg's default reset when a connection goes back to the pool. The default
    # runs "SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL" — a second round trip
    # after every single-statement call. Sundial sets no session state (no SET, LISTEN, advisory locks
    # or cursors outside transactions), and asyncpg still rolls back any transaction left open.
    return None


class Store:
    """Typed access to Sundial's tables over one asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    @classmethod
    async def connect(cls, dsn: str, *, min_size: int = 1, max_size: int = 10) -> Store:
        pool = await asyncpg.create_pool(
            dsn, min_size=min_size, max_size=max_size, init=_init_connection, reset=_keep_session
        )
        return cls(pool)

    async def close(self) -> None:
        await self.pool.close()

    async def ping(self) -> None:
        await self.pool.fetchval(Q["ping"])

    # --- jobs (API) -------------------------------------------------------------------------

    async def insert_job(self, values: dict[str, Any], actor: str) -> Record:
        row = await self.pool.fetchrow(
            Q["insert_job"],
            values["id"],
            values["tenant_id"],
            values["name"],
            values["type"],
            values.get("schedule"),
            values.get("timezone", "UTC"),
            values.get("run_at"),
            values.get("delay_seconds"),
            values["pool"],
            values["handler"],
            values.get("payload", {}),
            values.get("retry_policy", {}),
            values["timeout_sec"],
            values.get("priority", "NORMAL"),
            values.get("state", "ACTIVE"),
            values["shard"],
            values.get("next_fire_at"),
            values.get("traceparent"),
            actor,
        )
        assert row is not None
        return cast(Record, row)

    async def get_job(self, tenant_id: str, job_id: UUID) -> Record | None:
        return cast(Record | None, await self.pool.fetchrow(Q["get_job"], job_id, tenant_id))

    async def cancel_job(self, tenant_id: str, job_id: UUID, actor: str) -> Record | None:
        """ACTIVE/PAUSED → CANCELLED; None when the job was not cancellable (or not this tenant's)."""
        return cast(Record | None, await self.pool.fetchrow(Q["cancel_job"], job_id, tenant_id, actor))

    async def latest_executions(self, job_id: UUID, limit: int) -> list[Record]:
        return cast(list[Record], await self.pool.fetch(Q["latest_executions"], job_id, limit))

    async def page_executions(self, job_id: UUID, after: tuple[datetime, UUID] | None, limit: int) -> list[Record]:
        after_time, after_id = after if after else (None, None)
        return cast(list[Record], await self.pool.fetch(Q["page_executions"], job_id, after_time, after_id, limit))

    async def get_execution(self, tenant_id: str, execution_id: UUID) -> Record | None:
        return cast(Record | None, await self.pool.fetchrow(Q["get_execution"], execution_id, tenant_id))

    async def execution_attempts(self, execution_id: UUID) -> list[Record]:
        return cast(list[Record], await self.pool.fetch(Q["execution_attempts"], execution_id))

    # --- hot window (hydrator) --------------------------------------------------------------

    async def hydration_range(self, shard: int, after: Occurrence, end: datetime, limit: int) -> list[Occurrence]:
        """Active jobs of ``shard`` due before ``end``, in (due, id) order strictly after ``after``."""
        rows = await self.pool.fetch(Q["hydration_range"], shard, after.due, end, after.job_id, limit)
        return [Occurrence(row["id"], row["next_fire_at"]) for row in rows]

    async def overdue_jobs(self, shard: int, before: datetime, limit: int) -> list[Occurrence]:
        rows = await self.pool.fetch(Q["overdue_jobs"], shard, before, limit)
        return [Occurrence(row["id"], row["next_fire_at"]) for row in rows]

    # --- dispatch ---------------------------------------------------------------------------

    async def dispatch(
        self,
        shard: int,
        token: int,
        holder: str,
        claims: Sequence[Occurrence],
        plan: Callable[[Sequence[Record]], list[PlannedExecution]],
    ) -> list[PlannedExecution]:
        """The fenced dispatch transaction (DESIGN invariants 2 and 4).

        Raises the shard's fence to ``token`` (or raises :class:`FencedOut`), locks the claimed jobs
        that still match Postgres, lets ``plan`` decide each execution and next fire, inserts the
        executions (unique per occurrence) and advances the jobs with compare-and-set. Returns the
        executions actually created; publishing them is the caller's job, after commit.
        """
        if not claims:
            return []
        async with self.pool.acquire() as conn, conn.transaction():
            if await conn.fetchval(Q["raise_fence"], shard, token, holder) is None:
                raise FencedOut(shard, token)
            due = await conn.fetch(Q["lock_due_jobs"], [c.job_id for c in claims], [c.due for c in claims], shard)
            planned = plan(due)
            if not planned:
                return []
            inserted = await conn.fetch(
                Q["insert_executions"],
                [p.execution_id for p in planned],
                [p.job["tenant_id"] for p in planned],
                [p.job["id"] for p in planned],
                [p.job["next_fire_at"] for p in planned],
                [p.job["pool"] for p in planned],
                [p.job["handler"] for p in planned],
                [p.max_attempts for p in planned],
                [p.job["timeout_sec"] for p in planned],
                shard,
                token,
                [p.trace_id for p in planned],
                [p.traceparent for p in planned],
                holder,
            )
            await conn.execute(
                Q["advance_jobs"],
                [p.job["id"] for p in planned],
                [p.job["next_fire_at"] for p in planned],
                [p.next_fire_at for p in planned],
            )
        created = {row["id"] for row in inserted}
        return [p for p in planned if p.execution_id in created]

    async def mark_published(self, execution_ids: Sequence[UUID]) -> None:
        if execution_ids:
            await self.pool.execute(Q["mark_published"], list(execution_ids))

    # --- sweeper ----------------------------------------------------------------------------

    async def stale_pending(self, unpublished_before: datetime, published_before: datetime, limit: int) -> list[Record]:
        return cast(
            list[Record], await self.pool.fetch(Q["stale_pending"], unpublished_before, published_before, limit)
        )

    async def republished(self, execution_ids: Sequence[UUID]) -> None:
        if execution_ids:
            await self.pool.execute(Q["republished"], list(execution_ids))

    # --- worker -----------------------------------------------------------------------------

    async def start_executions(self, worker_id: str, claims: Sequence[tuple[UUID, int]]) -> list[Record]:
        """PENDING → RUNNING for the given (execution id, attempt) pairs; returns those this worker won."""
        if not claims:
            return []
        return cast(
            list[Record],
            await self.pool.fetch(Q["start_executions"], [c[0] for c in claims], [c[1] for c in claims], worker_id),
        )

    async def finish_executions(self, worker_id: str, outcomes: Sequence[Outcome]) -> set[UUID]:
        """RUNNING → terminal for attempts this worker owns; returns the ids whose write was accepted."""
        if not outcomes:
            return set()
        rows = await self.pool.fetch(
            Q["finish_executions"],
            [o.execution_id for o in outcomes],
            [o.attempt for o in outcomes],
            [o.state for o in outcomes],
            [o.result for o in outcomes],
            [o.error for o in outcomes],
            worker_id,
        )
        return {row["id"] for row in rows}

    async def record_progress(self, execution_id: UUID, attempt: int, worker_id: str, progress: Any) -> bool:
        row = await self.pool.fetchrow(Q["record_progress"], execution_id, attempt, worker_id, progress)
        return row is not None
