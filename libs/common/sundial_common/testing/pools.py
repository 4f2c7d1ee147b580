"""InMemoryPoolStore: the pool registry in a dict, for tests of the logic that admits work into pools."""

from __future__ import annotations

import copy
import dataclasses
from datetime import datetime

from sundial_common.runtime.clock import Clock, SystemClock
from sundial_common.stores.pools import Deleted, Pool, Updated


class InMemoryPoolStore:
    """:class:`~sundial_common.stores.pools.PoolStore` over a dict: versions and timestamps as Postgres keeps them
    (``created_at``/``updated_at`` from ``clock``). It holds no jobs, so no job ever stops a pool from turning
    staging or from being deleted (as in a database without any)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._pools: dict[str, Pool] = {}

    async def create_pool(self, pool: Pool) -> Pool | None:
        """Register ``pool``; None when its name is already registered."""
        if pool.name in self._pools:
            return None
        at = self._clock.now()
        created = _stored(pool, version=1, created_at=at, updated_at=at)
        self._pools[pool.name] = created
        return _read(created)

    async def get_pool(self, name: str) -> Pool | None:
        pool = self._pools.get(name)
        return _read(pool) if pool is not None else None

    async def list_pools(self, after: str | None, limit: int, tenant: str | None = None) -> list[Pool]:
        """Up to ``limit`` pools in name order after ``after``; with ``tenant``, only those it may use."""
        names = sorted(n for n in self._pools if after is None or n > after)
        pools = (_read(self._pools[n]) for n in names)
        return [p for p in pools if tenant is None or p.admits(tenant)][:limit]

    async def update_pool(self, pool: Pool, expected_version: int | None = None) -> Updated:
        """Write the changeable fields of ``pool`` (owner, sharing, kind, job defaults); nothing if it is unknown
        or not at ``expected_version``. Partitions and retention are the topic's, fixed at creation."""
        current = self._pools.get(pool.name)
        if current is None or (expected_version is not None and current.version != expected_version):
            return Updated(None, 0)
        fixed = dataclasses.replace(pool, partitions=current.partitions, retention_ms=current.retention_ms)
        updated = _stored(
            fixed,
            version=current.version + 1,
            created_at=current.created_at,
            updated_at=self._clock.now(),
        )
        self._pools[pool.name] = updated
        return Updated(_read(updated), 0)

    async def delete_pool(self, name: str) -> Deleted:
        found = self._pools.pop(name, None) is not None
        return Deleted(found=found, deleted=found, active_jobs=0)


def _stored(pool: Pool, *, version: int, created_at: datetime | None, updated_at: datetime) -> Pool:
    """``pool`` as a row of the table reads back: the columns the database sets, and the default retry policy
    copied (a jsonb value is the database's own, not the caller's dict)."""
    policy = copy.deepcopy(pool.default_retry_policy)
    return dataclasses.replace(
        pool, default_retry_policy=policy, version=version, created_at=created_at, updated_at=updated_at
    )


def _read(pool: Pool) -> Pool:
    """A stored pool as a read hands it out: a copy, as every read of the table is."""
    return dataclasses.replace(pool, default_retry_policy=copy.deepcopy(pool.default_retry_policy))
