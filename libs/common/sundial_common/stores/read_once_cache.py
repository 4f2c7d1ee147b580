"""Registry answers by key, each kept ``ttl_sec``, an expired one read once however many callers want it.

The tenant cache (API) and the pool cache (API and workers) keep answers from Postgres this way: a caller that
finds its entry fresh gets it without a query; callers that find it expired together wait for one read (under
load, every request of the moment used to send its own query). Absent keys are answers too (``None``). A
:meth:`ReadOnceCache.put` made while a read was in flight wins over that read's older answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

log = logging.getLogger("sundial.cache")

#: Most answers one cache keeps (an unknown key is an answer too).
CACHE_SIZE = 10_000


class ReadOnceCache(Generic[K, V]):
    """``read(key)`` answers, each kept ``ttl_sec``.

    ``keep_on`` names the read errors that keep the last answer (logged; the next call reads again) instead of
    failing the callers; a key never answered still fails.
    """

    def __init__(
        self,
        read: Callable[[K], Awaitable[V | None]],
        ttl_sec: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        keep_on: tuple[type[BaseException], ...] = (),
        what: str = "entry",
    ) -> None:
        self.read = read
        self.ttl_sec = ttl_sec
        self.clock = clock
        self.keep_on = keep_on
        self.what = what
        self._entries: dict[K, tuple[V | None, float]] = {}
        self._reading: dict[K, asyncio.Future[V | None]] = {}

    async def get(self, key: K) -> V | None:
        now = self.clock()
        entry = self._entries.get(key)
        if entry is not None and now - entry[1] < self.ttl_sec:
            return entry[0]
        reading = self._reading.get(key)
        if reading is None:
            reading = self._reading[key] = asyncio.ensure_future(self._read(key, now))
            reading.add_done_callback(lambda done: self._read_done(key, done))
        # Shielded: a caller that is cancelled must not cancel the read the others wait for.
        return await asyncio.shield(reading)

    async def _read(self, key: K, started: float) -> V | None:
        entry = self._entries.get(key)
        try:
            value = await self.read(key)
        except self.keep_on as exc:
            if entry is None:
                raise
            log.warning("%s %s: registry not read (%r); keeping the last answer", self.what, key, exc)
            return entry[0]
        latest = self._entries.get(key)
        if latest is not None and latest[1] > started:  # put() meanwhile: that is newer
            return latest[0]
        if len(self._entries) >= CACHE_SIZE:
            self._entries.clear()
        self._entries[key] = (value, started)
        return value

    def _read_done(self, key: K, done: asyncio.Future[V | None]) -> None:
        if self._reading.get(key) is done:
            del self._reading[key]
        if not done.cancelled():
            done.exception()  # retrieved here too: its callers may all have gone

    def put(self, key: K, value: V) -> None:
        self._entries[key] = (value, self.clock())

    def forget(self, key: K) -> None:
        """Drop the entry and any read in flight: the next :meth:`get` reads anew (a read sent before now may
        miss what the caller looks for)."""
        self._entries.pop(key, None)
        self._reading.pop(key, None)
