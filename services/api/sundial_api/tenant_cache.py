"""The registry cache: which tenants this API replica accepts tokens for, without a query per request.

Authentication looks the token's tenant up here (:mod:`sundial_api.auth`). Each answer — registered, with its
state and quotas, or unknown — is kept for ``tenant_cache_sec`` (2 s by default): a registration, suspension
or quota change made through *another* replica applies on this one within that time; one made through this
replica's admin routes applies at once (they refresh the entry). An expired entry is read once, however many
requests find it expired together: the others wait for that read (under load, every request of the moment
used to send its own query).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sundial_common.stores.read_once_cache import ReadOnceCache
from sundial_common.stores.tenants import Tenant, TenantStore


class TenantCache:
    """Registry answers by tenant id, each kept ``ttl_sec``."""

    def __init__(self, store: TenantStore, ttl_sec: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self._cache: ReadOnceCache[str, Tenant] = ReadOnceCache(store.get_tenant, ttl_sec, clock)

    async def get(self, tenant_id: str) -> Tenant | None:
        return await self._cache.get(tenant_id)

    def put(self, tenant: Tenant) -> None:
        self._cache.put(tenant.id, tenant)
