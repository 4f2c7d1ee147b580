"""The pool store: the registry of pools — who may use each (its owner, or the tenants it is shared among), its
kind (``production``, or ``staging``: the only kind a replay may target), its topic's partitions and retention,
and the defaults its jobs inherit (timeout, retry policy).

The API refuses work for a pool that is not registered (422) or that the caller's tenant may not use (403),
reading the registry through a short cache (:mod:`sundial_api.pool_cache`); a worker reads its own pool's
entry the same way and refuses messages of other tenants (:mod:`sundial_worker.pool_guard`).
SQL: ``sql/pools.sql``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from sundial_common.stores.database import Database
from sundial_common.stores.queries import load_file
from sundial_common.stores.types import Record

Q = load_file("pools.sql")

PRODUCTION = "production"
STAGING = "staging"
KINDS = (PRODUCTION, STAGING)
#: Who runs a pool's executions: the tenant's workers, or Sundial's delivery workers POSTing to the pool's target.
WORKER = "worker"
HTTP = "http"
DELIVERIES = (WORKER, HTTP)


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    #: The tenant the pool belongs to; None for a shared pool.
    owner: str | None = None
    #: The tenants a shared pool admits (empty for an owned pool).
    shared_with: tuple[str, ...] = ()
    kind: str = PRODUCTION
    #: The topic's partitions and retention when Sundial created it; None: the broker's defaults / the setting.
    partitions: int | None = None
    retention_ms: int | None = None
    #: What a job in this pool gets when its create gives no ``timeoutSec`` / ``retryPolicy``.
    default_timeout_sec: int | None = None
    default_retry_policy: dict[str, Any] | None = None
    version: int = 1
    #: ``worker`` or ``http`` (:data:`DELIVERIES`).
    delivery: str = WORKER
    created_at: datetime | None = None
    updated_at: datetime | None = None
    tenants: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        allowed = {self.owner} if self.owner is not None else set(self.shared_with)
        object.__setattr__(self, "tenants", frozenset(allowed))

    @property
    def staging(self) -> bool:
        return self.kind == STAGING

    def admits(self, tenant_id: str) -> bool:
        """Whether ``tenant_id`` may send work into this pool."""
        return tenant_id in self.tenants

    @classmethod
    def from_row(cls, row: Record) -> Pool:
        return cls(
            name=row["name"],
            owner=row["owner"],
            shared_with=tuple(row["shared_with"]),
            kind=row["kind"],
            partitions=row["partitions"],
            retention_ms=row["retention_ms"],
            default_timeout_sec=row["default_timeout_sec"],
            default_retry_policy=row["default_retry_policy"],
            version=row["version"],
            delivery=row.get("delivery", WORKER),
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )


@dataclass(frozen=True, slots=True)
class Updated:
    """What :meth:`PoolStore.update_pool` did: the pool as written, or None — unknown, at another version, or
    turning staging while ``active_jobs`` (> 0) jobs that can still fire target it."""

    pool: Pool | None
    active_jobs: int


@dataclass(frozen=True, slots=True)
class Deleted:
    """What :meth:`PoolStore.delete_pool` did: ``found`` and ``deleted``, or the jobs that stopped it."""

    found: bool
    deleted: bool
    active_jobs: int


class PoolStore(Protocol):
    """The pool registry."""

    async def create_pool(self, pool: Pool) -> Pool | None: ...

    async def get_pool(self, name: str) -> Pool | None: ...

    async def list_pools(self, after: str | None, limit: int, tenant: str | None = None) -> list[Pool]: ...

    async def update_pool(self, pool: Pool, expected_version: int | None = None) -> Updated: ...

    async def delete_pool(self, name: str) -> Deleted: ...


class PostgresPoolStore:
    """:class:`PoolStore` over the shared pool."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def create_pool(self, pool: Pool) -> Pool | None:
        """Register ``pool``; None when its name is already registered."""
        row = await self._db.pool.fetchrow(
            Q["create_pool"],
            pool.name,
            pool.owner,
            list(pool.shared_with),
            pool.kind,
            pool.partitions,
            pool.retention_ms,
            pool.default_timeout_sec,
            pool.default_retry_policy,
            pool.delivery,
        )
        return Pool.from_row(row) if row is not None else None

    async def get_pool(self, name: str) -> Pool | None:
        row = await self._db.pool.fetchrow(Q["get_pool"], name)
        return Pool.from_row(row) if row is not None else None

    async def list_pools(self, after: str | None, limit: int, tenant: str | None = None) -> list[Pool]:
        """Up to ``limit`` pools in name order after ``after``; with ``tenant``, only those it may use."""
        return [Pool.from_row(r) for r in await self._db.pool.fetch(Q["list_pools"], after, limit, tenant)]

    async def update_pool(self, pool: Pool, expected_version: int | None = None) -> Updated:
        """Write the changeable fields of ``pool``; nothing if it is unknown, not at ``expected_version``, or would
        turn staging while jobs that can still fire target it (:class:`Updated` says)."""
        row = await self._db.pool.fetchrow(
            Q["update_pool"],
            pool.name,
            pool.owner,
            list(pool.shared_with),
            pool.kind,
            pool.default_timeout_sec,
            pool.default_retry_policy,
            expected_version,
            pool.delivery,
        )
        assert row is not None
        return Updated(Pool.from_row(row) if row["name"] is not None else None, int(row["active_jobs"]))

    async def delete_pool(self, name: str) -> Deleted:
        """Delete ``name`` unless jobs that can still fire target it."""
        row = await self._db.pool.fetchrow(Q["delete_pool"], name)
        assert row is not None
        return Deleted(found=row["found"], deleted=row["deleted"], active_jobs=int(row["active_jobs"]))
