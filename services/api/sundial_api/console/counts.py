"""Counts of a tenant's jobs by state, as the jobs page shows them, kept a few seconds per tenant.

The count is one pass over the tenant's jobs in Postgres. It is kept while the tenant's version in the change feed
(:mod:`sundial_api.change_feed`) stays the same, and at most :data:`KEEP_SEC` when the feed has no version, so
every open tab of a tenant on this process shares one count instead of each refresh running its own.
"""

from __future__ import annotations

import time

from sundial_common.stores.jobs import JobStore

#: How long a tenant's counts are reused.
KEEP_SEC = 5.0
#: Most tenants whose counts are kept at once (the oldest are dropped first).
MAX_TENANTS = 1024


class StateCounts:
    """Jobs per state of each tenant, from ``jobs``' ``count_tenant_jobs``, reused for :data:`KEEP_SEC`."""

    def __init__(self, jobs: JobStore, keep_sec: float = KEEP_SEC) -> None:
        self._jobs = jobs
        self._keep_sec = keep_sec
        self._kept: dict[str, tuple[float, str | None, dict[str, int]]] = {}

    async def of(self, tenant: str, version: str | None) -> dict[str, int]:
        """The tenant's counts, as of its ``version`` in the change feed (None: not known)."""
        now = time.monotonic()
        kept = self._kept.get(tenant)
        if kept is not None and now - kept[0] < self._keep_sec and (version is None or kept[1] == version):
            return kept[2]
        counts = await self._jobs.count_tenant_jobs(tenant)
        self._kept.pop(tenant, None)
        self._kept[tenant] = (now, version, counts)
        if len(self._kept) > MAX_TENANTS:
            del self._kept[next(iter(self._kept))]
        return counts
