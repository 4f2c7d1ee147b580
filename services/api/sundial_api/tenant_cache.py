"""The registry cache: which tenants this API replica accepts tokens for, without a query per request.

Authentication looks the token's tenant up here (:mod:`sundial_api.auth`). Each answer — registered, with its
state and quotas, or unknown — is kept for ``tenant_cache_sec`` (2 s by default): a registration, suspension
or quota change made through *another* replica applies on this one within that time; one made through this
replica's admin routes applies at once (they refresh the entry).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sundial_common.stores.tenants import Tenant, TenantStore

#: Most registry answers one replica keeps (an unknown name is an answer too).
CACHE_SIZE = 10_000


class TenantCache:
    """Registry answers by tenant id, each kept ``ttl_sec``."""

    def __init__(self, store: TenantStore, ttl_sec: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.ttl_sec = ttl_sec
        self.clock = clock
        self._entries: dict[str, tuple[Tenant | None, float]] = {}

    async def get(self, tenant_id: str) -> Tenant | None:
        now = self.clock()
        entry = self._entries.get(tenant_id)
        if entry is not None and now - entry[1] < self.ttl_sec:
            return entry[0]
        tenant = await self.store.get_tenant(tenant_id)
        if len(self._entries) >= CACHE_SIZE:
            self._entries.clear()
        self._entries[tenant_id] = (tenant, now)
        return tenant

    def put(self, tenant: Tenant) -> None:
        self._entries[tenant.id] = (tenant, self.clock())
