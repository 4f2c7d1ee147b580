"""The job store: jobs' definitions and lifecycle (create, change, pause, resume, trigger, cancel, read,
list), and the hydrator's scans of the jobs coming due.

SQL: ``sql/jobs.sql``. Every write records its audit row in the same statement. The executions a job's
occurrences become are the dispatch store's (:mod:`sundial_common.stores.dispatch`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, cast
from uuid import UUID

import asyncpg

from sundial_common.stores.database import Database
from sundial_common.stores.queries import load_file
from sundial_common.stores.tenants import ActiveJobsQuotaExceeded, room_for_jobs_on
from sundial_common.stores.types import Occurrence, Record, by_shard

Q = load_file("jobs.sql")

#: The unique index that holds each tenant's job keys.
KEY_INDEX = "jobs_tenant_key_idx"


class JobKeyTaken(Exception):
    """A job's ``key`` is already registered by another job of its tenant; nothing was written."""

    def __init__(self, tenant_id: str, key: str) -> None:
        super().__init__(f"tenant {tenant_id} already has a job with key {key!r}")
        self.tenant_id = tenant_id
        self.key = key


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which of a tenant's jobs to list; None means "any". ``name_prefix`` matches the start of the name."""

    state: str | None = None
    type: str | None = None
    pool: str | None = None
    handler: str | None = None
    name_prefix: str | None = None
    #: Every label here must be on the job with the same value.
    labels: Mapping[str, str] | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    next_fire_from: datetime | None = None
    next_fire_to: datetime | None = None
    #: The job registered with this key (at most one).
    key: str | None = None


#: Column defaults of a new job when the caller leaves them out (see ``insert_job``).
_JOB_DEFAULTS: dict[str, Any] = {
    "timezone": "UTC",
    "payload": {},
    "retry_policy": {},
    "priority": "NORMAL",
    "state": "ACTIVE",
    "jitter_sec": 0,
    "overlap_policy": "ALLOW",
    "catchup_policy": "FIRE_ONCE",
    "catchup_window_sec": 60,
    "labels": {},
}


class JobStore(Protocol):
    """Jobs as the API changes them and the hydrator finds them due."""

    async def insert_job(self, values: dict[str, Any], actor: str, *, max_active_jobs: int | None = None) -> Record: ...

    async def insert_jobs(
        self, jobs: Sequence[Mapping[str, Any]], actor: str, *, max_active_jobs: int | None = None
    ) -> list[Record]: ...

    async def insert_grouped_jobs(self, jobs: Sequence[tuple[Mapping[str, Any], str]]) -> list[Record]: ...

    async def get_job(self, tenant_id: str, job_id: UUID) -> Record | None: ...

    async def get_job_by_key(self, tenant_id: str, key: str) -> Record | None: ...

    async def update_job(
        self, current: Record, values: Mapping[str, Any], actor: str, detail: Mapping[str, Any]
    ) -> Record | None: ...

    async def pause_job(self, tenant_id: str, job_id: UUID, actor: str) -> Record | None: ...

    async def resume_job(self, tenant_id: str, job_id: UUID, actor: str) -> Record | None: ...

    async def trigger_job(
        self,
        tenant_id: str,
        job_id: UUID,
        at: datetime,
        execution_id: UUID,
        actor: str,
        traceparent: str | None = None,
    ) -> Record | None: ...

    async def pending_trigger(self, tenant_id: str, execution_id: UUID) -> Record | None: ...

    async def cancel_job(self, tenant_id: str, job_id: UUID, actor: str) -> Record | None: ...

    async def hydration_ranges(
        self, after: Mapping[int, Occurrence], end: datetime, limit: int
    ) -> dict[int, list[Occurrence]]: ...

    async def overdue_occurrences(
        self, shards: Sequence[int], before: datetime, limit: int
    ) -> dict[int, list[Occurrence]]: ...

    async def list_jobs(self, tenant_id: str, where: JobFilter, before: UUID | None, limit: int) -> list[Record]: ...

    async def list_jobs_by_next_fire(
        self, tenant_id: str, where: JobFilter, after: tuple[datetime | None, UUID] | None, limit: int
    ) -> list[Record]: ...

    async def count_jobs(self) -> dict[tuple[str, str], int]: ...

    async def count_tenant_jobs(self, tenant_id: str) -> dict[str, int]: ...

    async def prune_ended_jobs(self, before: datetime, limit: int) -> int: ...


class PostgresJobStore:
    """:class:`JobStore` over the shared pool."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def insert_job(self, values: dict[str, Any], actor: str, *, max_active_jobs: int | None = None) -> Record:
        """Register one job; with ``max_active_jobs``, raise ``ActiveJobsQuotaExceeded`` (nothing written) if the
        tenant has that many jobs that can still fire."""
        if max_active_jobs is None:
            return await insert_job_on(self._db.pool, values, actor)
        async with self._db.pool.acquire() as conn, conn.transaction():
            return await insert_job_on(conn, values, actor, max_active_jobs=max_active_jobs)

    async def insert_jobs(
        self, jobs: Sequence[Mapping[str, Any]], actor: str, *, max_active_jobs: int | None = None
    ) -> list[Record]:
        """Register many jobs in one round trip; rows come back in the order of ``jobs``.

        Each mapping holds ``jobs`` column values; absent optional columns take the same defaults as
        :meth:`insert_job`. With ``max_active_jobs`` only the first jobs that fit are written (the caller
        answers the others with the quota).
        """
        if max_active_jobs is None:
            return await insert_jobs_on(self._db.pool, jobs, actor)
        async with self._db.pool.acquire() as conn, conn.transaction():
            return await insert_jobs_on(conn, jobs, actor, max_active_jobs=max_active_jobs)

    async def insert_grouped_jobs(self, jobs: Sequence[tuple[Mapping[str, Any], str]]) -> list[Record]:
        """Register jobs of any tenants, each with its own audit actor, in one statement (one commit); rows come
        back in the order of ``jobs``. Either all are written or, on any error, none."""
        return await _insert_rows(self._db.pool, jobs)

    async def get_job(self, tenant_id: str, job_id: UUID) -> Record | None:
        return cast(Record | None, await self._db.pool.fetchrow(Q["get_job"], job_id, tenant_id))

    async def get_job_by_key(self, tenant_id: str, key: str) -> Record | None:
        """The tenant's job registered with ``key``; None when it has none."""
        return cast(Record | None, await self._db.pool.fetchrow(Q["get_job_by_key"], tenant_id, key))

    async def update_job(
        self, current: Record, values: Mapping[str, Any], actor: str, detail: Mapping[str, Any]
    ) -> Record | None:
        """Write a job's new definition if it is still at ``current``'s version, next fire and state.

        ``detail`` goes into the audit row written by the same statement (what changed, before and after).

        ``values`` holds every definition column (as ``insert_job`` takes them) plus ``next_fire_at``,
        ``next_nominal_at`` and ``state``. None when another writer got there first.
        """
        row = await self._db.pool.fetchrow(
            Q["update_job"],
            current["id"],
            current["tenant_id"],
            current["version"],
            current["next_fire_at"],
            current["state"],
            values["name"],
            values["type"],
            values.get("schedule"),
            values["timezone"],
            values.get("run_at"),
            values.get("delay_seconds"),
            values["pool"],
            values["handler"],
            values["payload"],
            values["retry_policy"],
            values["timeout_sec"],
            values["priority"],
            values.get("interval_sec"),
            values.get("run_list"),
            values.get("start_at"),
            values.get("end_at"),
            values.get("max_runs"),
            values["jitter_sec"],
            values["overlap_policy"],
            values["catchup_policy"],
            values["catchup_window_sec"],
            values["next_fire_at"],
            values["next_nominal_at"],
            values["state"],
            actor,
            dict(detail),
            values.get("labels", current["labels"]),
            values.get("breaker", current["breaker"]),
        )
        return cast(Record | None, row)

    async def pause_job(self, tenant_id: str, job_id: UUID, actor: str) -> Record | None:
        """ACTIVE → PAUSED; None when the job was not active (or not this tenant's)."""
        return cast(Record | None, await self._db.pool.fetchrow(Q["pause_job"], job_id, tenant_id, actor))

    async def resume_job(self, tenant_id: str, job_id: UUID, actor: str) -> Record | None:
        """PAUSED → ACTIVE (COMPLETED if it has no occurrence left); None when the job was not paused."""
        return cast(Record | None, await self._db.pool.fetchrow(Q["resume_job"], job_id, tenant_id, actor))

    async def trigger_job(
        self,
        tenant_id: str,
        job_id: UUID,
        at: datetime,
        execution_id: UUID,
        actor: str,
        traceparent: str | None = None,
    ) -> Record | None:
        """Record a manual run request; None when the job is cancelled, unknown, or already has one pending."""
        return cast(
            Record | None,
            await self._db.pool.fetchrow(Q["trigger_job"], job_id, tenant_id, at, execution_id, actor, traceparent),
        )

    async def pending_trigger(self, tenant_id: str, execution_id: UUID) -> Record | None:
        """The job whose manual run ``execution_id`` is accepted but not created yet; None otherwise."""
        return cast(Record | None, await self._db.pool.fetchrow(Q["pending_trigger"], execution_id, tenant_id))

    async def cancel_job(self, tenant_id: str, job_id: UUID, actor: str) -> Record | None:
        """ACTIVE/PAUSED → CANCELLED; None when the job was not cancellable (or not this tenant's)."""
        return cast(Record | None, await self._db.pool.fetchrow(Q["cancel_job"], job_id, tenant_id, actor))

    # --- the hydrator's scans -----------------------------------------------------------------

    async def hydration_ranges(
        self, after: Mapping[int, Occurrence], end: datetime, limit: int
    ) -> dict[int, list[Occurrence]]:
        """Per shard of ``after``: up to ``limit`` active jobs due before ``end``, in (due, id) order strictly after
        the shard's position; one statement for every shard."""
        shards = list(after)
        rows = await self._db.pool.fetch(
            Q["hydration_ranges"],
            shards,
            [after[shard].due for shard in shards],
            [after[shard].job_id for shard in shards],
            end,
            limit,
        )
        return by_shard(shards, rows, lambda row: Occurrence(row["id"], row["next_fire_at"]))

    async def overdue_occurrences(
        self, shards: Sequence[int], before: datetime, limit: int
    ) -> dict[int, list[Occurrence]]:
        """Per shard of ``shards``: active jobs that should have fired before ``before`` and manual triggers pending
        since before it (their member was lost), up to ``limit`` of each kind; one statement for every shard."""
        rows = await self._db.pool.fetch(Q["overdue_occurrences"], list(shards), before, limit)
        return by_shard(shards, rows, lambda row: Occurrence(row["id"], row["at"]))

    async def count_jobs(self) -> dict[tuple[str, str], int]:
        """How many jobs each (tenant, state) has (the sweeper's sampled gauge)."""
        rows = await self._db.pool.fetch(Q["count_jobs"])
        return {(row["tenant_id"], row["state"]): row["jobs"] for row in rows}

    async def count_tenant_jobs(self, tenant_id: str) -> dict[str, int]:
        """How many jobs the tenant has in each state (the console's counts, one pass over its jobs)."""
        rows = await self._db.pool.fetch(Q["count_tenant_jobs"], tenant_id)
        return {row["state"]: row["jobs"] for row in rows}

    async def prune_ended_jobs(self, before: datetime, limit: int) -> int:
        """Delete up to ``limit`` jobs that ended (of any type) and last changed before ``before``, oldest first,
        with their edges as a DEPENDENT child, triggers and backfills (the sweeper's job retention: ``before``
        precedes every execution left); how many went. A job a dependency names, or with a manual run or a
        backfill that may still make an execution, stays."""
        return int(await self._db.pool.fetchval(Q["prune_ended_jobs"], before, limit))

    async def list_jobs(self, tenant_id: str, where: JobFilter, before: UUID | None, limit: int) -> list[Record]:
        """Up to ``limit`` of the tenant's jobs matching ``where``, newest first, with ids below ``before``."""
        rows = await self._db.pool.fetch(
            Q["list_jobs"],
            tenant_id,
            where.state,
            where.type,
            where.pool,
            where.handler,
            where.name_prefix,
            before,
            limit,
            dict(where.labels) if where.labels else None,
            where.created_from,
            where.created_to,
            where.next_fire_from,
            where.next_fire_to,
            where.key,
        )
        return cast(list[Record], rows)

    async def list_jobs_by_next_fire(
        self, tenant_id: str, where: JobFilter, after: tuple[datetime | None, UUID] | None, limit: int
    ) -> list[Record]:
        """Up to ``limit`` of the tenant's jobs matching ``where``, soonest next fire first (none: last), after
        the job ``after`` names by its next fire and id."""
        rows = await self._db.pool.fetch(
            Q["list_jobs_by_next_fire"],
            tenant_id,
            where.state,
            where.type,
            where.pool,
            where.handler,
            where.name_prefix,
            dict(where.labels) if where.labels else None,
            where.created_from,
            where.created_to,
            where.next_fire_from,
            where.next_fire_to,
            after[0] if after is not None else None,
            after[1] if after is not None else None,
            limit,
        )
        return cast(list[Record], rows)


# The inserts run on the pool or, for an Idempotency-Key (sundial_common.stores.idempotency), on the
# connection of the transaction that completes the key.


async def insert_job_on(
    conn: asyncpg.Pool | asyncpg.Connection,
    values: Mapping[str, Any],
    actor: str,
    *,
    max_active_jobs: int | None = None,
) -> Record:
    """``insert_job`` on ``conn``: the job and its audit row (an unknown tenant is registered with the defaults:
    the API only gets here for registered tenants).

    ``max_active_jobs`` needs ``conn`` to be a connection inside a transaction (the quota's lock lasts to its end).
    """
    if max_active_jobs is not None:
        assert isinstance(conn, asyncpg.Connection)
        room, current = await room_for_jobs_on(conn, values["tenant_id"], max_active_jobs)
        if room < 1:
            raise ActiveJobsQuotaExceeded(values["tenant_id"], max_active_jobs, current)
    try:
        row = await conn.fetchrow(Q["insert_job"], *_job_args(values, actor))
    except asyncpg.UniqueViolationError as exc:
        raise _key_taken(exc, values) from None
    assert row is not None
    return cast(Record, row)


async def insert_jobs_on(
    conn: asyncpg.Pool | asyncpg.Connection,
    jobs: Sequence[Mapping[str, Any]],
    actor: str,
    *,
    max_active_jobs: int | None = None,
) -> list[Record]:
    """``insert_jobs`` on ``conn``; rows come back in the order of ``jobs`` (with ``max_active_jobs``, only the
    first that fit: see :func:`insert_job_on`)."""
    if jobs and max_active_jobs is not None:
        assert isinstance(conn, asyncpg.Connection)
        room, _ = await room_for_jobs_on(conn, jobs[0]["tenant_id"], max_active_jobs)
        jobs = jobs[:room]
    return await _insert_rows(conn, [(job, actor) for job in jobs])


async def _insert_rows(
    conn: asyncpg.Pool | asyncpg.Connection, jobs: Sequence[tuple[Mapping[str, Any], str]]
) -> list[Record]:
    """Jobs, each with its audit actor, in one statement; rows come back in the order of ``jobs``."""
    if not jobs:
        return []
    rows = [{**_JOB_DEFAULTS, "next_nominal_at": job.get("next_fire_at"), **job, "actor": actor} for job, actor in jobs]
    try:
        fetched = await conn.fetch(Q["insert_jobs"], rows)
    except asyncpg.UniqueViolationError as exc:
        raise _key_taken(exc, *(job for job, _ in jobs)) from None
    by_id = {row["id"]: row for row in fetched}
    return [cast(Record, by_id[job["id"]]) for job, _ in jobs]


def _job_args(values: Mapping[str, Any], actor: str) -> tuple[Any, ...]:
    """``insert_job``'s parameters, in order, from a job's column values (absent optional ones defaulted)."""
    return (
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
        values.get("interval_sec"),
        values.get("run_list"),
        values.get("start_at"),
        values.get("end_at"),
        values.get("max_runs"),
        values.get("jitter_sec", 0),
        values.get("overlap_policy", "ALLOW"),
        values.get("catchup_policy", "FIRE_ONCE"),
        values.get("catchup_window_sec", 60),
        values.get("next_nominal_at", values.get("next_fire_at")),
        values.get("labels", {}),
        values.get("breaker"),
        values.get("key"),
        values.get("key_digest"),
    )


def _key_taken(exc: Exception, *jobs: Mapping[str, Any]) -> Exception:
    """A job key already registered (a create racing another with the same key): :class:`JobKeyTaken`, naming it.

    Any other unique violation is returned as it is. Of several jobs, the first with a key is named: the API writes a
    keyed job alone, so there is one.
    """
    keyed = [job for job in jobs if job.get("key") is not None]
    constraint = getattr(exc, "constraint_name", None)
    if constraint != KEY_INDEX or not keyed:
        return exc
    return JobKeyTaken(keyed[0]["tenant_id"], keyed[0]["key"])
