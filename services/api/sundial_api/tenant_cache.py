"""The registry cache: which tenants this API replica accepts tokens for, without a query per request.

Authentication looks the token's tenant up here (:mod:`sundial_api.auth`). Each answer — registered, with its
state and quotas, or unknown — is kept for ``tenant_cache_sec`` (2 s by default): a registration, suspension
or quota change made through *another* replica applies on this one within that time; one made through this
replica's admin routes applies at once (they refresh the entry). An expired entry is read once, however many
requests find it expired together: the others wait for that read (under load, every request of the moment
used to send its own query).
"""

from __future__ import annotations

import asyncio
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
        self._reading: dict[str, asyncio.Future[Tenant | None]] = {}

    async def get(self, tenant_id: str) -> Tenant | None:
        now = self.clock()
        entry = self._entries.get(tenant_id)
        if entry is not None and now - entry[1] < self.ttl_sec:
            return entry[0]
        reading = self._reading.get(tenant_id)
        if reading is None:
            reading = self._reading[tenant_id] = asyncio.ensure_future(self._read(tenant_id, now))
            reading.add_done_callback(lambda done: self._read_done(tenant_id, done))
        # Shielded: a waiter whose request is cancelled must not cancel the read the others wait for.
        return await asyncio.shield(reading)

    async def _read(self, tenant_id: str, started: float) -> Tenant | None:
        tenant = await self.store.get_tenant(tenant_id)
        entry = self._entries.get(tenant_id)
        if entry is not None and entry[1] > started:  # put() by an admin route meanwhile: that is newer
            return entry[0]
        if len(self._entries) >= CACHE_SIZE:
            self._entries.clear()
        self._entries[tenant_id] = (tenant, started)
        return tenant

    def _read_done(self, tenant_id: str, done: asyncio.Future[Tenant | None]) -> None:
        if self._reading.get(tenant_id) is done:
            del self._reading[tenant_id]
        if not done.cancelled():
            done.exception()  # retrieved here too: its waiters may all have gone

    def put(self, tenant: Tenant) -> None:
        self._entries[tenant.id] = (tenant, self.clock())
