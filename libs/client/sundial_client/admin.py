"""``client.admin``: the operator's calls (an admin token): the cluster view, the tenant and pool registries.

Written once, over asyncio (:class:`AsyncAdmin`); the blocking client runs these same methods on its own loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from sundial_client import calls
from sundial_client.caller import Caller, check_page_size, pages
from sundial_client.models import ClusterView, Pool, Tenant
from sundial_client.models.notifications import AllowedDestination

#: The registries' largest page.
MAX_REGISTRY_PAGE = 500


class AsyncAdmin:
    """``client.admin``."""

    def __init__(self, client: Caller) -> None:
        self.client = client

    async def cluster(self) -> ClusterView:
        """Replicas, shard leaders, fences, lease TTLs."""
        return await self.client.call(calls.cluster())

    async def create_tenant(self, /, tenant_id: str, **fields: Any) -> Tenant:
        """Register a tenant: ``display_name``, ``weight``, ``quotas`` (a mapping or :class:`Quotas`),
        ``default_jitter_sec``."""
        return await self.client.call(calls.create_tenant({"id": tenant_id, **fields}))

    def tenants(self, *, page_size: int = 100) -> AsyncIterator[Tenant]:
        """Every registered tenant, in id order (pages fetched as needed)."""
        size = check_page_size(page_size, MAX_REGISTRY_PAGE)
        return pages(self.client, lambda cursor: calls.list_tenants(cursor=cursor, limit=size))

    async def tenant(self, tenant_id: str) -> Tenant:
        return await self.client.call(calls.get_tenant(tenant_id))

    async def update_tenant(self, /, tenant_id: str, **fields: Any) -> Tenant:
        """Change fields of a tenant; ``quotas`` changes the quotas it names (None: unlimited)."""
        return await self.client.call(calls.update_tenant(tenant_id, fields))

    async def suspend_tenant(self, tenant_id: str) -> Tenant:
        """Its writes are refused (403) and its jobs stop dispatching until resumed."""
        return await self.client.call(calls.suspend_tenant(tenant_id))

    async def resume_tenant(self, tenant_id: str) -> Tenant:
        return await self.client.call(calls.resume_tenant(tenant_id))

    async def create_pool(self, /, name: str, **fields: Any) -> Pool:
        """Register a pool and create its topic: ``owner`` or ``shared_with``, ``kind``, ``partitions``,
        ``retention_ms``, ``default_timeout_sec``, ``default_retry_policy``."""
        return await self.client.call(calls.create_pool({"name": name, **fields}))

    def pools(self, *, page_size: int = 100) -> AsyncIterator[Pool]:
        """Every registered pool, in name order (pages fetched as needed)."""
        size = check_page_size(page_size, MAX_REGISTRY_PAGE)
        return pages(self.client, lambda cursor: calls.list_pools(cursor=cursor, limit=size))

    async def pool(self, name: str) -> Pool:
        return await self.client.call(calls.get_pool(name))

    async def update_pool(self, /, name: str, **fields: Any) -> Pool:
        """Change who may use a pool (``owner`` or ``shared_with``), its ``kind`` or its job defaults."""
        return await self.client.call(calls.update_pool(name, fields))

    async def delete_pool(self, name: str) -> None:
        """Delete a pool no active job targets (else :class:`~sundial_client.errors.Conflict`, naming how many)."""
        await self.client.call(calls.delete_pool(name))

    async def allow_destination(self, tenant: str, url: str) -> AllowedDestination:
        """Let ``tenant``'s notification subscriptions reach ``url``'s scheme, host and port, at the addresses its
        host resolves to now, although they are not public."""
        return await self.client.call(calls.allow_destination(tenant, url))

    async def allowed_destinations(self, tenant: str | None = None) -> list[AllowedDestination]:
        return (await self.client.call(calls.allowed_destinations(tenant))).items

    async def revoke_destination(self, tenant: str, url: str) -> None:
        """Withdraw an allowance: the tenant's subscriptions to that destination are refused from their next send."""
        await self.client.call(calls.revoke_destination(tenant, url))
