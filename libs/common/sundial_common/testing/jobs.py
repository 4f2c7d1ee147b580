"""InMemoryJobStore: jobs in a dict, for tests of the logic that creates, changes, lists and hydrates jobs."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from sundial_common.runtime.clock import Clock, SystemClock
from sundial_common.stores.jobs import JobFilter, JobKeyTaken
from sundial_common.stores.tenants import ActiveJobsQuotaExceeded, Tenant
from sundial_common.stores.types import Occurrence, Record
from sundial_common.testing.tenants import InMemoryTenantStore

#: Every column of ``jobs`` a write may leave out, with the value Postgres gives it then.
JOB_DEFAULTS: Mapping[str, Any] = {
    "schedule": None,
    "timezone": "UTC",
    "run_at": None,
    "delay_seconds": None,
    "payload": {},
    "retry_policy": {},
    "priority": "NORMAL",
    "state": "ACTIVE",
    "next_fire_at": None,
    "fire_count": 0,
    "version": 1,
    "traceparent": None,
    "interval_sec": None,
    "run_list": None,
    "start_at": None,
    "end_at": None,
    "max_runs": None,
    "jitter_sec": 0,
    "overlap_policy": "ALLOW",
    "catchup_policy": "FIRE_ONCE",
    "catchup_window_sec": 60,
    "next_nominal_at": None,
    "missed_fires": 0,
    "trigger_at": None,
    "trigger_execution_id": None,
    "trigger_traceparent": None,
    "labels": {},
    "breaker": None,
    "key": None,
    "key_digest": None,
}
#: The columns a PATCH writes (``update_job``'s ``values``), beside ``labels`` and ``breaker``.
_DEFINITION = (
    "name", "type", "schedule", "timezone", "run_at", "delay_seconds", "pool", "handler", "payload", "retry_policy",
    "timeout_sec", "priority", "interval_sec", "run_list", "start_at", "end_at", "max_runs", "jitter_sec",
    "overlap_policy", "catchup_policy", "catchup_window_sec", "next_fire_at", "next_nominal_at", "state",
)  # fmt: skip
_OPEN = ("ACTIVE", "PAUSED")
#: Any instant, in place of a missing next fire where only the jobs without one are compared.
NEVER = datetime(1970, 1, 1, tzinfo=UTC)
_ENDED = ("COMPLETED", "CANCELLED")


class InMemoryJobStore:
    """:class:`~sundial_common.stores.jobs.JobStore` over a dict: the rows, versions and timestamps Postgres keeps
    (``created_at``/``updated_at`` from ``clock``), the same compare-and-sets, without the audit rows.

    It holds no executions and no dependency graph: a listed job has no latest execution, a pause or cancel
    withdraws none, and no dependency keeps an ended job from being pruned. ``tenants``: the registry a job's
    unknown tenant is registered in, as the Postgres insert does (none: not registered anywhere).
    """

    def __init__(self, tenants: InMemoryTenantStore | None = None, clock: Clock | None = None) -> None:
        self._tenants = tenants
        self._clock = clock or SystemClock()
        self._jobs: dict[UUID, dict[str, Any]] = {}

    # --- writes -----------------------------------------------------------------------------------

    async def insert_job(self, values: dict[str, Any], actor: str, *, max_active_jobs: int | None = None) -> Record:
        """Register one job; with ``max_active_jobs``, raise ``ActiveJobsQuotaExceeded`` (nothing written) if the
        tenant has that many jobs that can still fire."""
        if max_active_jobs is not None:
            current = self._open_jobs(values["tenant_id"])
            if current >= max_active_jobs:
                raise ActiveJobsQuotaExceeded(values["tenant_id"], max_active_jobs, current)
        [row] = await self.insert_grouped_jobs([(values, actor)])
        return row

    async def insert_jobs(
        self, jobs: Sequence[Mapping[str, Any]], actor: str, *, max_active_jobs: int | None = None
    ) -> list[Record]:
        """Register many jobs, in the order of ``jobs``; with ``max_active_jobs`` only the first that fit."""
        if jobs and max_active_jobs is not None:
            jobs = jobs[: max(0, max_active_jobs - self._open_jobs(jobs[0]["tenant_id"]))]
        return await self.insert_grouped_jobs([(job, actor) for job in jobs])

    async def insert_grouped_jobs(self, jobs: Sequence[tuple[Mapping[str, Any], str]]) -> list[Record]:
        """Register jobs of any tenants; all or, if an id is taken (Postgres' primary key), none; a job key its
        tenant has already (the unique index): :class:`JobKeyTaken`, nothing written."""
        ids = [job["id"] for job, _ in jobs]
        if len(set(ids)) < len(ids) or any(i in self._jobs for i in ids):
            raise ValueError("a job with this id exists already")
        keys = [(job["tenant_id"], job["key"]) for job, _ in jobs if job.get("key") is not None]
        taken = {(r["tenant_id"], r["key"]) for r in self._jobs.values() if r["key"] is not None}
        for index, (tenant, key) in enumerate(keys):
            if (tenant, key) in taken or (tenant, key) in keys[:index]:
                raise JobKeyTaken(tenant, key)
        now = self._clock.now()
        for job, _ in jobs:
            if self._tenants is not None and await self._tenants.get_tenant(job["tenant_id"]) is None:
                await self._tenants.create_tenant(Tenant(job["tenant_id"]))
            row = {**JOB_DEFAULTS, "next_nominal_at": job.get("next_fire_at"), **copy.deepcopy(dict(job))}
            self._jobs[job["id"]] = {**row, "fire_count": 0, "missed_fires": 0, "version": 1, "created_at": now}
            self._jobs[job["id"]]["updated_at"] = now
        return [self._read(i) for i in ids]

    async def update_job(
        self, current: Record, values: Mapping[str, Any], actor: str, detail: Mapping[str, Any]
    ) -> Record | None:
        """Write a job's new definition if it is still at ``current``'s version, next fire and state."""
        row = self._jobs.get(current["id"])
        if (
            row is None
            or row["tenant_id"] != current["tenant_id"]
            or (
                (row["version"], row["next_fire_at"], row["state"])
                != (current["version"], current["next_fire_at"], current["state"])
            )
        ):
            return None
        row.update({name: copy.deepcopy(values.get(name)) for name in _DEFINITION})
        row["labels"] = copy.deepcopy(values.get("labels", row["labels"]))
        row["breaker"] = copy.deepcopy(values.get("breaker", row["breaker"]))
        return self._moved(row)

    async def pause_job(self, tenant_id: str, job_id: UUID, actor: str) -> Record | None:
        """ACTIVE → PAUSED; None when the job was not active (or not this tenant's)."""
        row = self._owned(tenant_id, job_id, ("ACTIVE",))
        if row is None:
            return None
        row["state"] = "PAUSED"
        return self._moved(row)

    async def resume_job(self, tenant_id: str, job_id: UUID, actor: str) -> Record | None:
        """PAUSED → ACTIVE (COMPLETED if it has no occurrence left); None when the job was not paused."""
        row = self._owned(tenant_id, job_id, ("PAUSED",))
        if row is None:
            return None
        row["state"] = "COMPLETED" if row["next_fire_at"] is None and row["type"] != "DEPENDENT" else "ACTIVE"
        return self._moved(row)

    async def cancel_job(self, tenant_id: str, job_id: UUID, actor: str) -> Record | None:
        """ACTIVE/PAUSED → CANCELLED; None when the job was not cancellable (or not this tenant's)."""
        row = self._owned(tenant_id, job_id, _OPEN)
        if row is None:
            return None
        row["state"], row["next_fire_at"] = "CANCELLED", None
        return self._moved(row)

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
        row = self._jobs.get(job_id)
        if row is None or row["tenant_id"] != tenant_id or row["state"] == "CANCELLED" or row["trigger_at"]:
            return None
        row.update(trigger_at=at, trigger_execution_id=execution_id, trigger_traceparent=traceparent)
        row["updated_at"] = self._clock.now()  # a request, not a change of definition: the version stays
        return self._read(job_id)

    async def prune_ended_jobs(self, before: datetime, limit: int) -> int:
        """Delete up to ``limit`` jobs that ended and last changed before ``before``, oldest first, but not one
        with a manual run still waiting; how many."""
        ended = sorted(
            (
                r
                for r in self._jobs.values()
                if r["state"] in _ENDED and r["updated_at"] < before and not r["trigger_at"]
            ),
            key=lambda r: r["updated_at"],
        )[:limit]
        for row in ended:
            del self._jobs[row["id"]]
        return len(ended)

    def forget(self, job_ids: Sequence[UUID]) -> None:
        """Remove jobs as a rolled-back transaction would (for a store that writes jobs with its own rows)."""
        for job_id in job_ids:
            self._jobs.pop(job_id, None)

    # --- reads ------------------------------------------------------------------------------------

    async def get_job(self, tenant_id: str, job_id: UUID) -> Record | None:
        row = self._jobs.get(job_id)
        return self._read(job_id) if row is not None and row["tenant_id"] == tenant_id else None

    async def get_job_by_key(self, tenant_id: str, key: str) -> Record | None:
        """The tenant's job registered with ``key``; None when it has none."""
        for row in self._jobs.values():
            if row["tenant_id"] == tenant_id and row["key"] == key:
                return self._read(row["id"])
        return None

    async def pending_trigger(self, tenant_id: str, execution_id: UUID) -> Record | None:
        """The job whose manual run ``execution_id`` is accepted but not created yet; None otherwise."""
        for row in self._jobs.values():
            if row["trigger_execution_id"] == execution_id and row["tenant_id"] == tenant_id:
                return self._read(row["id"])
        return None

    async def list_jobs(self, tenant_id: str, where: JobFilter, before: UUID | None, limit: int) -> list[Record]:
        """Up to ``limit`` of the tenant's jobs matching ``where``, newest first, with ids below ``before``."""
        found = [r for r in self._jobs.values() if r["tenant_id"] == tenant_id and _matches(r, where)]
        page = sorted((r for r in found if before is None or r["id"] < before), key=lambda r: r["id"], reverse=True)
        return [{**self._read(r["id"]), "latest_execution_state": None} for r in page[:limit]]

    async def list_jobs_by_next_fire(
        self, tenant_id: str, where: JobFilter, after: tuple[datetime | None, UUID] | None, limit: int
    ) -> list[Record]:
        """Up to ``limit`` of the tenant's jobs matching ``where``, soonest next fire first (none: last), after
        the job ``after`` names by its next fire and id."""

        def key(row: Mapping[str, Any]) -> tuple[bool, datetime | None, UUID]:
            return (row["next_fire_at"] is None, row["next_fire_at"], row["id"])

        found = [r for r in self._jobs.values() if r["tenant_id"] == tenant_id and _matches(r, where)]
        if after is not None:
            mark = (after[0] is None, after[0], after[1])
            found = [r for r in found if _later(key(r), mark)]
        page = sorted(
            found, key=lambda r: (r["next_fire_at"] is None, (r["next_fire_at"] or NEVER).timestamp(), r["id"])
        )
        return [{**self._read(r["id"]), "latest_execution_state": None} for r in page[:limit]]

    async def count_jobs(self) -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for row in self._jobs.values():
            counts[(row["tenant_id"], row["state"])] = counts.get((row["tenant_id"], row["state"]), 0) + 1
        return counts

    async def count_tenant_jobs(self, tenant_id: str) -> dict[str, int]:
        return {state: n for (tenant, state), n in (await self.count_jobs()).items() if tenant == tenant_id}

    # --- the hydrator's scans ---------------------------------------------------------------------

    async def hydration_ranges(
        self, after: Mapping[int, Occurrence], end: datetime, limit: int
    ) -> dict[int, list[Occurrence]]:
        """Per shard of ``after``: up to ``limit`` active jobs due before ``end``, in (due, id) order strictly after
        the shard's position."""
        found: dict[int, list[Occurrence]] = {}
        for shard, position in after.items():
            due = sorted(
                (r["next_fire_at"], r["id"])
                for r in self._active(shard)
                if (r["next_fire_at"], r["id"]) > (position.due, position.job_id) and r["next_fire_at"] < end
            )
            found[shard] = [Occurrence(job_id, at) for at, job_id in due[:limit]]
        return found

    async def overdue_occurrences(
        self, shards: Sequence[int], before: datetime, limit: int
    ) -> dict[int, list[Occurrence]]:
        """Per shard: active jobs that should have fired before ``before`` and manual triggers pending since before
        it, up to ``limit`` of each kind, oldest first."""
        found: dict[int, list[Occurrence]] = {}
        for shard in shards:
            late = sorted((r["next_fire_at"], r["id"]) for r in self._active(shard) if r["next_fire_at"] < before)
            triggers = sorted(
                (r["trigger_at"], r["id"])
                for r in self._jobs.values()
                if r["shard"] == shard and r["trigger_at"] and r["trigger_at"] < before and r["state"] != "CANCELLED"
            )
            found[shard] = [Occurrence(job_id, at) for at, job_id in late[:limit] + triggers[:limit]]
        return found

    # --- helpers ----------------------------------------------------------------------------------

    def _open_jobs(self, tenant_id: str) -> int:
        return sum(1 for r in self._jobs.values() if r["tenant_id"] == tenant_id and r["state"] in _OPEN)

    def _owned(self, tenant_id: str, job_id: UUID, states: Sequence[str]) -> dict[str, Any] | None:
        row = self._jobs.get(job_id)
        return row if row is not None and row["tenant_id"] == tenant_id and row["state"] in states else None

    def _active(self, shard: int) -> list[dict[str, Any]]:
        return [
            r
            for r in self._jobs.values()
            if r["shard"] == shard and r["state"] == "ACTIVE" and r["next_fire_at"] is not None
        ]

    def _moved(self, row: dict[str, Any]) -> Record:
        """A state or definition change: the next version, now."""
        row["version"] += 1
        row["updated_at"] = self._clock.now()
        return self._read(row["id"])

    def _read(self, job_id: UUID) -> dict[str, Any]:
        """A row as a read hands it out: a copy, as every read of the table is."""
        return copy.deepcopy(self._jobs[job_id])


def _later(key: tuple[bool, datetime | None, UUID], mark: tuple[bool, datetime | None, UUID]) -> bool:
    """``key`` comes after ``mark`` in next-fire order (a job with no next fire after every job with one)."""
    if key[0] != mark[0]:
        return key[0]
    if key[1] is not None and mark[1] is not None and key[1] != mark[1]:
        return key[1] > mark[1]
    return key[2] > mark[2]


def _matches(row: Mapping[str, Any], where: JobFilter) -> bool:
    """Whether ``row`` passes every filter ``where`` sets (as ``list_jobs``' statement reads them)."""
    equal = (
        ("state", where.state),
        ("type", where.type),
        ("pool", where.pool),
        ("handler", where.handler),
        ("key", where.key),
    )
    if any(value is not None and row[column] != value for column, value in equal):
        return False
    if where.name_prefix is not None and not row["name"].startswith(where.name_prefix):
        return False
    if where.labels and not (row["labels"] and all(row["labels"].get(k) == v for k, v in where.labels.items())):
        return False
    created, fires = row["created_at"], row["next_fire_at"]
    return (
        (where.created_from is None or created >= where.created_from)
        and (where.created_to is None or created < where.created_to)
        and (where.next_fire_from is None or (fires is not None and fires >= where.next_fire_from))
        and (where.next_fire_to is None or (fires is not None and fires < where.next_fire_to))
    )
