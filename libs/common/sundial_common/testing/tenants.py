"""InMemoryTenantStore: the tenant registry in a dict, for tests of the logic that reads and changes tenants."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from sundial_common.runtime.clock import Clock, SystemClock
from sundial_common.stores.tenants import OpenExecutions, Tenant


class InMemoryTenantStore:
    """:class:`~sundial_common.stores.tenants.TenantStore` over a dict: versions and timestamps as Postgres keeps
    them (``created_at``/``updated_at`` from ``clock``). It holds no jobs and no executions, so what counts them
    answers as a database without any would; the pool registry's names are ``pools`` (none unless a test adds them)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._tenants: dict[str, Tenant] = {}
        self.pools: set[str] = set()

    async def create_tenant(self, tenant: Tenant) -> Tenant | None:
        """Register ``tenant``; None when its id is already registered."""
        if tenant.id in self._tenants:
            return None
        at = self._clock.now()
        created = _stored(tenant, version=1, created_at=at, updated_at=at)
        self._tenants[tenant.id] = created
        return _read(created)

    async def get_tenant(self, tenant_id: str) -> Tenant | None:
        tenant = self._tenants.get(tenant_id)
        return _read(tenant) if tenant is not None else None

    async def list_tenants(self, after: str | None, limit: int) -> list[Tenant]:
        """Up to ``limit`` tenants in id order, with ids after ``after``."""
        return [t for t in await self.all_tenants() if after is None or t.id > after][:limit]

    async def all_tenants(self) -> list[Tenant]:
        return [_read(self._tenants[k]) for k in sorted(self._tenants)]

    async def update_tenant(self, tenant: Tenant, expected_version: int | None = None) -> Tenant | None:
        """Write every field of ``tenant``; None if it is unknown or not at ``expected_version``."""
        current = self._tenants.get(tenant.id)
        if current is None or (expected_version is not None and current.version != expected_version):
            return None
        updated = _stored(
            tenant, version=current.version + 1, created_at=current.created_at, updated_at=self._clock.now()
        )
        self._tenants[tenant.id] = updated
        return _read(updated)

    async def count_open_jobs(self, tenant_id: str) -> int:
        return 0

    async def job_owners(self, job_ids: Sequence[UUID]) -> dict[UUID, tuple[str, str, str]]:
        return {}

    async def retry_owners(self, execution_ids: Sequence[UUID]) -> dict[UUID, tuple[str, str, str]]:
        return {}

    async def registered_pools(self) -> list[str]:
        return sorted(self.pools)

    async def open_executions(
        self, queued_within_sec: float, fresh_within_sec: float | None = None
    ) -> list[OpenExecutions]:
        return []


def _stored(tenant: Tenant, *, version: int, created_at: datetime | None, updated_at: datetime) -> Tenant:
    """``tenant`` as a row of the table reads back: the columns the database sets, and a breaker copied (a jsonb
    value is the database's own, not the caller's dict)."""
    breaker = copy.deepcopy(dict(tenant.breaker)) if tenant.breaker is not None else None
    return dataclasses.replace(tenant, breaker=breaker, version=version, created_at=created_at, updated_at=updated_at)


def _read(tenant: Tenant) -> Tenant:
    """A stored tenant as a read hands it out: a copy, as every read of the table is."""
    return dataclasses.replace(tenant, breaker=copy.deepcopy(tenant.breaker))
