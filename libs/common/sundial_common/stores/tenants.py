"""The tenant store: the registry of tenants (display name, weight, quotas, default cron jitter, state, retry
circuit breaker settings).

A tenant must be registered, and ACTIVE, for the API to accept its tokens (the API caches the registry
for a few seconds, :mod:`sundial_api.tenants`); the dispatcher reads every tenant's weight, quotas and
state for its fair pass. A quota that is None is unlimited. SQL: ``sql/tenants.sql``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

import asyncpg

from sundial_common.stores.database import Database
from sundial_common.stores.queries import load_file
from sundial_common.stores.types import Record

Q = load_file("tenants.sql")

ACTIVE = "ACTIVE"
SUSPENDED = "SUSPENDED"


@dataclass(frozen=True, slots=True)
class Quotas:
    """Per-tenant limits; None is unlimited."""

    #: Jobs that can still fire (ACTIVE or PAUSED) at most; a create beyond it is refused (403).
    max_active_jobs: int | None = None
    #: Job creates per second (token bucket, burst of one second); beyond it 429 with Retry-After.
    max_creates_per_sec: float | None = None
    #: PENDING or RUNNING executions at most; due work beyond it waits (late, never lost).
    max_concurrent_executions: int | None = None
    #: Executions dispatched per second at most, across every shard leader (token bucket in Redis).
    max_dispatch_per_sec: float | None = None


QUOTA_FIELDS = tuple(f.name for f in fields(Quotas))


@dataclass(frozen=True, slots=True)
class Tenant:
    id: str
    display_name: str | None = None
    #: Share of dispatch under contention, relative to the other tenants due at the same time.
    weight: int = 1
    quotas: Quotas = field(default_factory=Quotas)
    #: Jitter applied to CRON jobs that give no ``jitterSec`` of their own (spreads midnight stampedes).
    default_jitter_sec: int = 0
    state: str = ACTIVE
    #: Retry circuit breaker settings of its own (camelCase keys of ``BreakerSettings``); None: the defaults.
    breaker: Mapping[str, Any] | None = None
    version: int = 1
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @property
    def active(self) -> bool:
        return self.state == ACTIVE

    @classmethod
    def from_row(cls, row: Record) -> Tenant:
        return cls(
            id=row["id"],
            display_name=row["display_name"],
            weight=row["weight"],
            quotas=Quotas(**{name: row[name] for name in QUOTA_FIELDS}),
            default_jitter_sec=row["default_jitter_sec"],
            state=row["state"],
            breaker=row["breaker"],
            version=row["version"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )


def _args(tenant: Tenant) -> tuple[Any, ...]:
    q = tenant.quotas
    return (
        tenant.id,
        tenant.display_name,
        tenant.weight,
        q.max_active_jobs,
        q.max_creates_per_sec,
        q.max_concurrent_executions,
        q.max_dispatch_per_sec,
        tenant.default_jitter_sec,
        tenant.state,
        dict(tenant.breaker) if tenant.breaker is not None else None,
    )


class ActiveJobsQuotaExceeded(Exception):
    """A create would take the tenant past its ``max_active_jobs``; nothing was written."""

    def __init__(self, tenant_id: str, limit: int, current: int) -> None:
        super().__init__(f"tenant {tenant_id}: maxActiveJobs is {limit} and it has {current}")
        self.tenant_id = tenant_id
        self.limit = limit
        self.current = current


class TenantStore(Protocol):
    """The tenant registry."""

    async def create_tenant(self, tenant: Tenant) -> Tenant | None: ...

    async def get_tenant(self, tenant_id: str) -> Tenant | None: ...

    async def list_tenants(self, after: str | None, limit: int) -> list[Tenant]: ...

    async def all_tenants(self) -> list[Tenant]: ...

    async def update_tenant(self, tenant: Tenant, expected_version: int | None = None) -> Tenant | None: ...

    async def count_open_jobs(self, tenant_id: str) -> int: ...

    async def job_owners(self, job_ids: Sequence[UUID]) -> dict[UUID, tuple[str, str, str]]: ...

    async def retry_owners(self, execution_ids: Sequence[UUID]) -> dict[UUID, tuple[str, str, str]]: ...

    async def registered_pools(self) -> list[str]: ...

    async def open_executions(
        self, queued_within_sec: float, fresh_within_sec: float | None = None
    ) -> list[OpenExecutions]: ...


@dataclass(frozen=True, slots=True)
class OpenExecutions:
    """One tenant's executions in one pool that have not ended."""

    tenant_id: str
    pool: str
    #: Published (or about to be) recently and not started: waiting in the pool's topic.
    queued: int
    #: PENDING and due, however old.
    pending: int
    #: Started and not ended.
    running: int
    #: PENDING or RUNNING.
    open: int
    #: Seconds the oldest PENDING one has waited (None: none is PENDING).
    waited_sec: float | None = None
    #: Of ``queued``, those dispatched within ``fresh_within_sec`` (None: not counted apart).
    fresh: int | None = None
    #: PENDING and published ahead of their due instant (not in ``pending``): held by a worker until then.
    ahead: int = 0


class PostgresTenantStore:
    """:class:`TenantStore` over the shared pool."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def create_tenant(self, tenant: Tenant) -> Tenant | None:
        """Register ``tenant``; None when its id is already registered."""
        row = await self._db.pool.fetchrow(Q["create_tenant"], *_args(tenant))
        return Tenant.from_row(row) if row is not None else None

    async def get_tenant(self, tenant_id: str) -> Tenant | None:
        row = await self._db.pool.fetchrow(Q["get_tenant"], tenant_id)
        return Tenant.from_row(row) if row is not None else None

    async def list_tenants(self, after: str | None, limit: int) -> list[Tenant]:
        """Up to ``limit`` tenants in id order, with ids after ``after``."""
        return [Tenant.from_row(r) for r in await self._db.pool.fetch(Q["list_tenants"], after, limit)]

    async def all_tenants(self) -> list[Tenant]:
        return [Tenant.from_row(r) for r in await self._db.pool.fetch(Q["all_tenants"])]

    async def update_tenant(self, tenant: Tenant, expected_version: int | None = None) -> Tenant | None:
        """Write every field of ``tenant``; None if it is unknown or not at ``expected_version``."""
        row = await self._db.pool.fetchrow(Q["update_tenant"], *_args(tenant), expected_version)
        return Tenant.from_row(row) if row is not None else None

    async def count_open_jobs(self, tenant_id: str) -> int:
        return int(await self._db.pool.fetchval(Q["count_open_jobs"], tenant_id))

    async def job_owners(self, job_ids: Sequence[UUID]) -> dict[UUID, tuple[str, str, str]]:
        """(tenant, pool, priority) of each job that exists."""
        rows = await self._db.pool.fetch(Q["job_owners"], list(job_ids))
        return {row["id"]: (row["tenant_id"], row["pool"], row["priority"]) for row in rows}

    async def retry_owners(self, execution_ids: Sequence[UUID]) -> dict[UUID, tuple[str, str, str]]:
        """(tenant, pool, priority) of each execution that exists: a scheduled retry's, as :meth:`job_owners`."""
        rows = await self._db.pool.fetch(Q["retry_owners"], list(execution_ids))
        return {row["id"]: (row["tenant_id"], row["pool"], row["priority"]) for row in rows}

    async def registered_pools(self) -> list[str]:
        """The name of every registered production pool (the API accepts jobs for these alone)."""
        return [row["name"] for row in await self._db.pool.fetch(Q["registered_pools"])]

    async def open_executions(
        self, queued_within_sec: float, fresh_within_sec: float | None = None
    ) -> list[OpenExecutions]:
        """Open executions per (tenant, pool); ``queued`` counts those dispatched within ``queued_within_sec``,
        ``fresh`` those within ``fresh_within_sec``."""
        fresh_sec = queued_within_sec if fresh_within_sec is None else fresh_within_sec
        rows = await self._db.fetch_every_partition(Q["open_executions"], queued_within_sec, fresh_sec)
        return [
            OpenExecutions(
                r["tenant_id"],
                r["pool"],
                r["queued"],
                r["pending"],
                r["running"],
                r["open"],
                float(r["waited_sec"]) if r["waited_sec"] is not None else None,
                r["fresh"],
                r["ahead"],
            )
            for r in rows
        ]


async def room_for_jobs_on(conn: asyncpg.Connection, tenant_id: str, max_active_jobs: int) -> tuple[int, int]:
    """Inside a create's transaction: (jobs the tenant may still create, jobs it has that count).

    Takes a per-tenant lock held to the end of the transaction first, so two creates never both take the
    last slot; only tenants with the quota pay for it.
    """
    await conn.execute(Q["lock_tenant_quota"], tenant_id)
    current = int(await conn.fetchval(Q["count_open_jobs"], tenant_id))
    return max(0, max_active_jobs - current), current
