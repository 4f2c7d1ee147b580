"""The dispatcher's view of the tenant registry: which tenants are suspended (their due work waits).

A shard leader reads the whole registry at most every ``refresh_sec`` (2 s by default) — one small query,
never one per pass — so a suspension or a resume applies to dispatch within that time. A suspended
tenant's due jobs are left exactly as they are (no execution, no move of the schedule) and looked at again
later; once resumed, the fires that came due meanwhile meet each job's catch-up policy, as after downtime.

This is the module the tenant-fairness work (weights, per-tenant dispatch rates, concurrency caps) grows
into; priority orders work within a tenant, never across tenants.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sundial_common.stores.tenants import Tenant, TenantStore

log = logging.getLogger(__name__)


class TenantPolicy:
    """The registry as one dispatcher process last read it."""

    def __init__(self, store: TenantStore, refresh_sec: float = 2.0, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.refresh_sec = refresh_sec
        self.clock = clock
        self._tenants: dict[str, Tenant] = {}
        self._suspended: frozenset[str] = frozenset()
        self._read_at: float | None = None

    async def _refresh(self) -> None:
        now = self.clock()
        if self._read_at is None or now - self._read_at >= self.refresh_sec:
            self._tenants = {t.id: t for t in await self.store.all_tenants()}
            self._suspended = frozenset(t.id for t in self._tenants.values() if not t.active)
            self._read_at = now

    async def suspended(self) -> frozenset[str]:
        """Tenants whose work must not be dispatched now (read again when older than ``refresh_sec``)."""
        await self._refresh()
        return self._suspended

    async def tenants(self) -> dict[str, Tenant]:
        """Every registered tenant by id (weights and quotas), as last read."""
        await self._refresh()
        return self._tenants
