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
others wait for that read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import asyncpg

from sundial_common.stores.pools import Pool, PoolStore

log = logging.getLogger("sundial.pools")

#: Most registry answers one process keeps (an unknown name is an answer too).
CACHE_SIZE = 10_000


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
        self.ttl_sec = ttl_sec
        self.clock = clock
        self.recheck_sec = recheck_sec
        self._entries: dict[str, tuple[Pool | None, float]] = {}
        self._rechecked: dict[str, float] = {}
        self._reading: dict[str, asyncio.Future[Pool | None]] = {}

    async def get(self, name: str) -> Pool | None:
        now = self.clock()
        entry = self._entries.get(name)
        if entry is not None and now - entry[1] < self.ttl_sec:
            return entry[0]
        reading = self._reading.get(name)
        if reading is None:
            reading = self._reading[name] = asyncio.ensure_future(self._read(name, now))
            reading.add_done_callback(lambda done: self._read_done(name, done))
        # Shielded: a caller that is cancelled must not cancel the read the others wait for.
        return await asyncio.shield(reading)

    async def _read(self, name: str, started: float) -> Pool | None:
        entry = self._entries.get(name)
        try:
            pool = await self.store.get_pool(name)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            if entry is None:
                raise
            log.warning("pool %s: registry not read (%r); keeping the last answer", name, exc)
            return entry[0]
        latest = self._entries.get(name)
        if latest is not None and latest[1] > started:  # put() meanwhile: that is newer
            return latest[0]
        if len(self._entries) >= CACHE_SIZE:
            self._entries.clear()
        self._entries[name] = (pool, started)
        return pool

    def _read_done(self, name: str, done: asyncio.Future[Pool | None]) -> None:
        if self._reading.get(name) is done:
            del self._reading[name]
        if not done.cancelled():
            done.exception()  # retrieved here too: its callers may all have gone

    async def recheck(self, name: str) -> Pool | None:
        """The entry read from the registry now — unless a recheck of ``name`` did so within ``recheck_sec``."""
        now = self.clock()
        if now - self._rechecked.get(name, float("-inf")) >= self.recheck_sec:
            if len(self._rechecked) >= CACHE_SIZE:
                self._rechecked.clear()
            self._rechecked[name] = now
            self._entries.pop(name, None)
            self._reading.pop(name, None)  # a read sent before now may miss what the caller looks for
        return await self.get(name)

    def put(self, pool: Pool) -> None:
        self._entries[pool.name] = (pool, self.clock())

    def forget(self, name: str) -> None:
        self._entries.pop(name, None)
