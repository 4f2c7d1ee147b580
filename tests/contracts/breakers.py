"""The breaker store under contract, with its tenants and a way to count a handler's finished attempts: in memory,
or on Postgres (where a trigger on ``executions`` counts them; the contract writes the counts it would)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from sundial_common.stores import Stores
from sundial_common.stores.breakers import BreakerStore
from sundial_common.stores.tenants import TenantStore
from sundial_common.testing import InMemoryBreakerStore, InMemoryTenantStore

#: (tenant, pool, handler, when it ended, failed?)
CountAttempt = Callable[[str, str, str, datetime, bool], Awaitable[None]]

_COUNT = """
INSERT INTO breaker_counts AS c (tenant_id, pool, handler, bucket, slot, attempts, failures)
VALUES ($1, $2, $3, date_trunc('second', $4::timestamptz), 0, 1, $5::int)
ON CONFLICT (tenant_id, pool, handler, bucket, slot)
DO UPDATE SET attempts = c.attempts + 1, failures = c.failures + excluded.failures
"""


@dataclass(frozen=True, slots=True)
class Breakers:
    """One implementation's breaker store, its tenant registry, and how an attempt's end is counted."""

    store: BreakerStore
    tenants: TenantStore
    count: CountAttempt

    @classmethod
    def in_memory(cls) -> Breakers:
        tenants = InMemoryTenantStore()
        store = InMemoryBreakerStore(tenants)

        async def count(tenant: str, pool: str, handler: str, at: datetime, failed: bool) -> None:
            store.count_attempt(tenant, pool, handler, at, failed=failed)

        return cls(store, tenants, count)

    @classmethod
    def postgres(cls, stores: Stores) -> Breakers:
        async def count(tenant: str, pool: str, handler: str, at: datetime, failed: bool) -> None:
            await stores.database.pool.execute(_COUNT, tenant, pool, handler, at, int(failed))

        return cls(stores.breakers, stores.tenants, count)
