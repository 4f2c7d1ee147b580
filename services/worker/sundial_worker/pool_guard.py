"""Defence in depth: a worker runs only the work of tenants its pool admits.

The API already refuses work for a pool the tenant may not use, so a message of another tenant in this pool's
topic is forged (anyone with the broker's credentials can publish) or misrouted (a job left in a pool that was
given to another tenant since). Its handler must not run: it would act with this pool's credentials for a
tenant they do not serve. Admission asks :meth:`PoolGuard.refusal` for each execution it won; a refused one
ends FAILED with the reason as its error, its handler never called (retried by the job's policy like any
failure, so a pool fixed meanwhile runs the retry), and the refusal is logged with tenant, pool and execution
and counted in ``sundial_pool_refusals_total{where="worker"}``.

The tenant checked is the execution row's (what the start CAS returned: Postgres's truth), and the message's
must agree with it. The pool's registry entry comes from a cache (:mod:`sundial_common.stores.pool_cache`, refreshed
every ``SUNDIAL_WORKER_POOL_CACHE_SEC``): one query per refresh, never one per message. Before refusing, the
entry is read again unless that was done within the last second (:meth:`PoolGuard.fresh_entry`), so a tenant
admitted moments ago is not refused by a stale entry, and a stream of refused messages costs at most one query a
second.
A pool that is not registered admits nobody.
"""

from __future__ import annotations

import logging
from typing import Any

from sundial_common.observability.metrics import POOL_REFUSALS, Children
from sundial_common.stores.pool_cache import PoolCache
from sundial_common.stores.pools import Pool

log = logging.getLogger("sundial.worker")

_refusals: Children[Any] = Children(POOL_REFUSALS)


class PoolGuard:
    """Whether this worker's pool admits an execution's tenant, from the registry cache."""

    def __init__(self, cache: PoolCache, pool: str) -> None:
        self.cache = cache
        self.pool = pool

    async def entry(self) -> Pool | None:
        """The pool's registry entry (cached; read again once it is older than the cache's TTL)."""
        return await self.cache.get(self.pool)

    async def fresh_entry(self) -> Pool | None:
        """The entry read from the registry now, unless a recheck did so within the cache's ``recheck_sec``."""
        return await self.cache.recheck(self.pool)

    def admits(self, entry: Pool | None, tenant: str, message_tenant: str) -> bool:
        return entry is not None and message_tenant == tenant and entry.admits(tenant)

    def refusal(self, entry: Pool | None, tenant: str, message_tenant: str) -> str | None:
        """Why an execution of ``tenant`` must not run here (its message claiming ``message_tenant``), or None."""
        if entry is None:
            reason = f"PoolRefused: pool '{self.pool}' is not registered; it runs no tenant's work"
        elif message_tenant != tenant:
            reason = (
                f"PoolRefused: the message claims tenant '{message_tenant}' but the execution is tenant '{tenant}''s"
            )
        elif not entry.admits(tenant):
            reason = f"PoolRefused: pool '{self.pool}' is not open to tenant '{tenant}'"
        else:
            return None
        _refusals("worker", "forbidden").inc()
        return reason

    @staticmethod
    def describe(entry: Pool | None) -> str:
        if entry is None:
            return "not registered: every message is refused until an operator registers it"
        who = f"owned by {entry.owner}" if entry.owner is not None else "shared by " + ", ".join(entry.shared_with)
        return f"{entry.kind}, {who}"
