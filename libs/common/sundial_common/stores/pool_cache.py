"""The pool registry cache: who may use a pool, without a query per request or per message.

The API checks every job create, batch item, target change, trigger and replay against it; a worker checks
each message's tenant against its own pool's entry. Each answer — the pool, or "not registered" — is kept
``ttl_sec`` (2 s by default in the API, 5 s in workers): a pool created, re-owned or deleted through another
replica applies here within that time; a change made through this API replica's admin routes applies at once
(they refresh the entry). Before refusing work, a caller reads the entry again with :meth:`PoolCache.recheck`
— a pool registered or shared a moment ago is not refused for a stale entry — at most once per
``recheck_sec`` per pool, so a stream of refused requests or messages costs at most that many queries. A
failed refresh keeps the last answer and retries at the next call, so a Postgres outage does not stop a worker
that already knew its pool. An expired entry is read once, however many callers find it expired together: the
others wait for that read (:class:`~sundial_common.stores.read_once_cache.ReadOnceCache`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import asyncpg

from sundial_common.stores.pools import Pool, PoolStore
from sundial_common.stores.read_once_cache import CACHE_SIZE, ReadOnceCache


class PoolCache:
    """Registry answers by pool name, each kept ``ttl_sec``."""

    def __init__(
        self,
        store: PoolStore,
        ttl_sec: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        recheck_sec: float = 0.25,
    ) -> None:
        self.store = store
        self.clock = clock
        self.recheck_sec = recheck_sec
        self._cache: ReadOnceCache[str, Pool] = ReadOnceCache(
            store.get_pool,
            ttl_sec,
            clock,
            keep_on=(OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError),
            what="pool",
        )
        self._rechecked: dict[str, float] = {}

    async def get(self, name: str) -> Pool | None:
        return await self._cache.get(name)

    async def recheck(self, name: str) -> Pool | None:
        """The entry read from the registry now — unless a recheck of ``name`` did so within ``recheck_sec``."""
        now = self.clock()
        if now - self._rechecked.get(name, float("-inf")) >= self.recheck_sec:
            if len(self._rechecked) >= CACHE_SIZE:
                self._rechecked.clear()
            self._rechecked[name] = now
            self._cache.forget(name)
        return await self._cache.get(name)

    def put(self, pool: Pool) -> None:
        self._cache.put(pool.name, pool)

    def forget(self, name: str) -> None:
        self._cache.forget(name)
