"""The dependency store: which DEPENDENT jobs wait on which parents, and the triggers their parents' final
states record, up to the executions the child's shard leader makes of them.

The graph is written in the API's transactions — a DEPENDENT job and its edges are created together
(:func:`insert_dependent_job_on`); a PATCH of its parents (:meth:`PostgresDependencyStore.replace_parents`) is
checked for cycles and for the documented limits under a per-tenant lock, so two concurrent changes cannot
close a cycle between them. Triggers are written by Postgres itself (migration 0015: a statement-level trigger
on ``executions`` fires in whatever transaction moves a parent's execution to a final state) and consumed by
the shard leader in one fenced transaction (:meth:`PostgresDependencyStore.trigger_transaction`) that the
caller drives in two steps: :meth:`TriggerTransaction.lock` raises the shard's fence and locks the children
with pending triggers; the caller decides the fires; :meth:`TriggerTransaction.write` inserts one execution
per fire (unique per child and trigger) and marks the triggers consumed. No code of the caller's runs in the
store.

SQL: ``sql/dependencies.sql``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, cast
from uuid import UUID

import asyncpg

from sundial_common.stores import dispatch
from sundial_common.stores.database import Database
from sundial_common.stores.jobs import insert_job_on
from sundial_common.stores.queries import load_file
from sundial_common.stores.types import Record

Q = load_file("dependencies.sql")

#: Most parents one job may wait on.
MAX_PARENTS = 10
#: Longest chain of jobs (A → B → … ), counted in jobs.
MAX_CHAIN_DEPTH = 10
#: Conditions an edge may ask of its parent's execution.
CONDITIONS = ("SUCCEEDED", "FAILED", "ANY")


@dataclass(frozen=True, slots=True)
class Edge:
    """One parent of a child job, and the final state the parent's execution must reach."""

    parent_job_id: UUID
    on: str = "SUCCEEDED"


class GraphError(Exception):
    """A dependency change refused, nothing written: ``status`` (404/409/422), the request ``field`` it names."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class TriggeredExecution:
    """An execution the leader makes of one or more triggers (a fan-in fire consumes one per parent at least)."""

    execution_id: UUID
    child: Record
    scheduled_for: datetime
    #: The trigger whose (child, trigger) pair is unique in ``executions``: the oldest one consumed.
    trigger_id: UUID
    caused_by: tuple[UUID, ...]
    max_attempts: int
    trace_id: str | None
    traceparent: str | None


@dataclass
class TriggerPlan:
    """What the caller decided for the locked children: the executions to insert, the triggers to consume."""

    executions: list[TriggeredExecution] = field(default_factory=list)
    #: (trigger id, FIRED or SKIPPED, the execution it became).
    consumed: list[tuple[UUID, str, UUID | None]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class LockedTriggers:
    """What :meth:`TriggerTransaction.lock` holds: the children, locked, and their pending triggers, oldest first."""

    children: list[Record] = field(default_factory=list)
    pending: list[Record] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TriggerOutcome:
    """What a trigger transaction wrote: the planned executions inserted (a fire whose trigger already had its
    execution is not among them), and the plan."""

    created: list[TriggeredExecution]
    plan: TriggerPlan


class DependencyStore(Protocol):
    """The dependency graph (API) and the triggers turned into executions (shard leader)."""

    async def create_dependent_job(
        self, values: dict[str, Any], edges: Sequence[Edge], actor: str, *, max_active_jobs: int | None = None
    ) -> Record: ...

    async def replace_parents(self, tenant_id: str, child_job_id: UUID, edges: Sequence[Edge], actor: str) -> None: ...

    async def parents_of(self, job_id: UUID) -> list[Record]: ...

    async def children_of(self, job_id: UUID, limit: int) -> list[Record]: ...

    async def waiting_triggers(self, job_id: UUID) -> dict[UUID, int]: ...

    async def live_descendants(self, job_id: UUID) -> list[Record]: ...

    async def cancel_with_descendants(self, tenant_id: str, job_id: UUID, actor: str) -> list[Record]: ...

    async def has_pending(self, shard: int) -> bool: ...

    def trigger_transaction(
        self, shard: int, token: int, holder: str
    ) -> AbstractAsyncContextManager[TriggerTransaction]: ...

    async def shards_with_side_work(self, shards: Sequence[int]) -> tuple[set[int], set[int]]: ...

    async def prune_consumed_triggers(self, before: datetime, limit: int) -> int: ...


async def check_parents_on(conn: asyncpg.Connection, tenant_id: str, child_job_id: UUID, edges: Sequence[Edge]) -> None:
    """Refuse (:class:`GraphError`) parents that are unknown, another tenant's, cancelled, repeated, too many,
    or that would close a cycle or a chain deeper than :data:`MAX_CHAIN_DEPTH`. Takes the tenant's graph lock."""
    if not edges:
        raise GraphError(422, "dependsOn", "must name at least one parent job")
    if len(edges) > MAX_PARENTS:
        raise GraphError(422, "dependsOn", f"names {len(edges)} parents; at most {MAX_PARENTS} are accepted")
    ids = [e.parent_job_id for e in edges]
    if len(set(ids)) < len(ids):
        raise GraphError(422, "dependsOn", "names the same parent twice")
    for i, edge in enumerate(edges):
        if edge.on not in CONDITIONS:
            raise GraphError(422, f"dependsOn[{i}].on", f"must be one of {', '.join(CONDITIONS)}")
    await conn.execute(Q["lock_graph"], tenant_id)
    found = {row["id"]: row for row in await conn.fetch(Q["jobs_by_id"], ids)}
    for i, edge in enumerate(edges):
        row = found.get(edge.parent_job_id)
        if row is None or row["tenant_id"] != tenant_id:
            # Another tenant's job is as unknown as a missing one: its existence is not disclosed.
            raise GraphError(404, f"dependsOn[{i}].jobId", f"job {edge.parent_job_id} not found")
        if row["state"] == "CANCELLED":
            raise GraphError(422, f"dependsOn[{i}].jobId", f"job {edge.parent_job_id} is CANCELLED")
    below = int(await conn.fetchval(Q["descendant_depth"], child_job_id, MAX_CHAIN_DEPTH) or 0)
    cycle = await conn.fetchrow(Q["cycle_path"], child_job_id, ids, MAX_CHAIN_DEPTH)
    assert cycle is not None
    if cycle["cycle"] is not None:
        # cycle: a proposed parent, its parent, … up to the child itself; each runs after the next.
        text = " → ".join(str(j) for j in [child_job_id, *cycle["cycle"]])
        raise GraphError(422, "dependsOn", f"would close a cycle (each job runs after the next): {text}")
    above = int(cycle["depth"] or 0)
    if above + 1 + below > MAX_CHAIN_DEPTH:
        raise GraphError(
            422, "dependsOn", f"would make a chain of {above + 1 + below} jobs; at most {MAX_CHAIN_DEPTH} are accepted"
        )


async def insert_dependent_job_on(
    conn: asyncpg.Connection,
    values: dict[str, Any],
    edges: Sequence[Edge],
    actor: str,
    *,
    max_active_jobs: int | None = None,
) -> Record:
    """A DEPENDENT job and its edges, on ``conn`` inside a transaction (:class:`GraphError`: nothing written)."""
    await check_parents_on(conn, values["tenant_id"], values["id"], edges)
    row = await insert_job_on(conn, values, actor, max_active_jobs=max_active_jobs)
    await _write_parents(conn, values["tenant_id"], values["id"], edges, actor)
    return row


async def _write_parents(
    conn: asyncpg.Connection, tenant_id: str, child_job_id: UUID, edges: Sequence[Edge], actor: str
) -> None:
    await conn.execute(
        Q["replace_parents"],
        child_job_id,
        [e.parent_job_id for e in edges],
        [e.on for e in edges],
        tenant_id,
        actor,
    )


class PostgresDependencyStore:
    """:class:`DependencyStore` over the shared pool."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def create_dependent_job(
        self, values: dict[str, Any], edges: Sequence[Edge], actor: str, *, max_active_jobs: int | None = None
    ) -> Record:
        async with self._db.pool.acquire() as conn, conn.transaction():
            return await insert_dependent_job_on(conn, values, edges, actor, max_active_jobs=max_active_jobs)

    async def replace_parents(self, tenant_id: str, child_job_id: UUID, edges: Sequence[Edge], actor: str) -> None:
        """A child's parents become ``edges`` (checked as at creation; :class:`GraphError`: nothing written)."""
        async with self._db.pool.acquire() as conn, conn.transaction():
            await check_parents_on(conn, tenant_id, child_job_id, edges)
            await _write_parents(conn, tenant_id, child_job_id, edges, actor)

    async def parents_of(self, job_id: UUID) -> list[Record]:
        return cast(list[Record], await self._db.pool.fetch(Q["parents_of"], job_id))

    async def children_of(self, job_id: UUID, limit: int) -> list[Record]:
        return cast(list[Record], await self._db.pool.fetch(Q["children_of"], job_id, limit))

    async def waiting_triggers(self, job_id: UUID) -> dict[UUID, int]:
        rows = await self._db.pool.fetch(Q["waiting_triggers"], job_id)
        return {row["parent_job_id"]: row["waiting"] for row in rows}

    async def live_descendants(self, job_id: UUID) -> list[Record]:
        """Jobs below ``job_id`` that can still fire (ACTIVE or PAUSED), nearest first."""
        return cast(list[Record], await self._db.pool.fetch(Q["live_descendants"], job_id, MAX_CHAIN_DEPTH))

    async def cancel_with_descendants(self, tenant_id: str, job_id: UUID, actor: str) -> list[Record]:
        """Cancel the live descendants of ``job_id`` (the caller cancels the job itself); the ones cancelled."""
        async with self._db.pool.acquire() as conn, conn.transaction():
            await conn.execute(Q["lock_graph"], tenant_id)
            below = await conn.fetch(Q["live_descendants"], job_id, MAX_CHAIN_DEPTH)
            if not below:
                return []
            done = {
                r["id"] for r in await conn.fetch(Q["cancel_jobs"], [r["id"] for r in below], tenant_id, actor, job_id)
            }
            return [r for r in below if r["id"] in done]

    async def shards_with_side_work(self, shards: Sequence[int]) -> tuple[set[int], set[int]]:
        """Which of ``shards`` have a trigger of an ACTIVE child waiting, and which a running backfill (a read: no
        fence). Both in one statement, though backfills are the backfill store's: it is the dispatcher's census,
        asked every second by every dispatcher process (``sundial_dispatcher.side_work``)."""
        triggers: set[int] = set()
        backfills: set[int] = set()
        for row in await self._db.pool.fetch(Q["shards_with_side_work"], list(shards)):
            (triggers if row["kind"] == "trigger" else backfills).add(row["shard"])
        return triggers, backfills

    async def prune_consumed_triggers(self, before: datetime, limit: int) -> int:
        """Delete up to ``limit`` triggers consumed before ``before``, oldest first (the sweeper's job retention:
        ``before`` precedes every execution left, so their parent's and their own executions are gone); how many."""
        return int(await self._db.pool.fetchval(Q["prune_consumed_triggers"], before, limit))

    async def has_pending(self, shard: int) -> bool:
        """Before the fenced transaction (a write): has ``shard`` a trigger of an ACTIVE child of a tenant not
        SUSPENDED waiting?"""
        return bool(await self._db.pool.fetchval(Q["any_pending"], shard))

    @contextlib.asynccontextmanager
    async def trigger_transaction(self, shard: int, token: int, holder: str) -> AsyncIterator[TriggerTransaction]:
        """The fenced trigger transaction of ``shard`` under ``token`` (``holder``'s term), driven by the caller:
        :meth:`TriggerTransaction.lock`, then the caller decides the fires, then :meth:`TriggerTransaction.write`.
        It commits when the block ends (rolls back if it raises). Publishing is the caller's, after commit: the
        execution rows are the outbox, as for any dispatch."""
        async with self._db.pool.acquire() as conn, conn.transaction():
            yield TriggerTransaction(conn, shard, token, holder)


class TriggerTransaction:
    """One open trigger transaction (:meth:`PostgresDependencyStore.trigger_transaction`): lock, then write."""

    def __init__(self, conn: asyncpg.Connection, shard: int, token: int, holder: str) -> None:
        self._conn = conn
        self._shard = shard
        self._token = token
        self._holder = holder
        self._locked = False

    async def lock(
        self, children: int, triggers: int, *, skip_tenants: Sequence[str] = (), skip_pools: Sequence[str] = ()
    ) -> LockedTriggers:
        """Raise the shard's fence to the token (or raise ``FencedOut``: a newer term has written), then lock up to
        ``children`` ACTIVE children of the shard with pending triggers (not of a SUSPENDED tenant, nor of
        ``skip_tenants`` or in ``skip_pools``) and read up to ``triggers`` of their pending triggers."""
        conn = self._conn
        if await conn.fetchval(dispatch.Q["raise_fence"], self._shard, self._token, self._holder) is None:
            raise dispatch.FencedOut(self._shard, self._token)
        self._locked = True
        locked = await conn.fetch(Q["pending_children"], self._shard, children, list(skip_tenants), list(skip_pools))
        if not locked:
            return LockedTriggers()
        pending = await conn.fetch(Q["pending_triggers"], [row["id"] for row in locked], triggers)
        return LockedTriggers(list(locked), list(pending))

    async def write(self, plan: TriggerPlan) -> TriggerOutcome:
        """Insert the plan's executions (one per child and trigger: a fire whose trigger already has its execution
        inserts nothing) and consume its triggers; what was inserted. Only after :meth:`lock`, whose fence and
        locks make the writes safe."""
        if not self._locked:
            raise RuntimeError("TriggerTransaction.write before lock: the shard's fence is not raised")
        conn = self._conn
        planned = plan.executions
        inserted: list[Record] = []
        if planned:
            inserted = await conn.fetch(
                Q["insert_triggered_executions"],
                [p.execution_id for p in planned],
                [p.child["tenant_id"] for p in planned],
                [p.child["id"] for p in planned],
                [p.scheduled_for for p in planned],
                [p.child["pool"] for p in planned],
                [p.child["handler"] for p in planned],
                [p.max_attempts for p in planned],
                [p.child["timeout_sec"] for p in planned],
                self._shard,
                self._token,
                [p.trace_id for p in planned],
                [p.traceparent for p in planned],
                [p.trigger_id for p in planned],
                [",".join(str(c) for c in p.caused_by) for p in planned],
                self._holder,
            )
        created_ids = {row["id"] for row in inserted}
        # A fire that inserted nothing met executions_trigger_key: its trigger already has its execution.
        consumed = plan.consumed
        if consumed:
            await conn.execute(
                Q["consume_triggers"], [c[0] for c in consumed], [c[1] for c in consumed], [c[2] for c in consumed]
            )
        return TriggerOutcome([p for p in planned if p.execution_id in created_ids], plan)
