"""Topic metadata of every registered pool, fetched before the first publish to it (task ``topics``).

The producer learns a topic's partitions and leaders the first time it produces to it; the dispatch pass that
first publishes to a pool would pay that round trip (and the broker's lookups) inside its publish. So at start, and
whenever the pool registry (:mod:`sundial_common.stores.pools`) has a pool this process has not looked up yet
(one read of the names every ``interval_sec``), the producer fetches the metadata of those pools' topics.
Best effort: a pool it missed is looked up by its first publish, as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from sundial_common.broker.messages import pool_topic
from sundial_common.stores.pools import PoolStore

log = logging.getLogger(__name__)

_PAGE = 1000


@dataclass(frozen=True)
class TopicMetadataConfig:
    #: How often the pool registry is read for pools not looked up yet.
    interval_sec: float = 30.0

    def __post_init__(self) -> None:
        if self.interval_sec <= 0:
            raise ValueError("interval_sec must be > 0")


class TopicMetadata:
    """Looks up the topics of registered pools ahead of their first publish; ``run(stop)`` until stopped."""

    def __init__(self, pools: PoolStore, publisher: object, config: TopicMetadataConfig) -> None:
        self._pools = pools
        # A publisher without a warm-up (a test's) makes this a no-op.
        self._warm: Callable[[list[str]], None] | None = getattr(publisher, "warm", None)
        self.config = config
        self._known: set[str] = set()

    async def run_once(self) -> int:
        """Look up the topics of pools not looked up yet; how many."""
        if self._warm is None:
            return 0
        names: list[str] = []
        after: str | None = None
        while True:
            page = await self._pools.list_pools(after, _PAGE)
            names += [p.name for p in page]
            if len(page) < _PAGE:
                break
            after = page[-1].name
        new = [n for n in names if n not in self._known]
        if not new:
            return 0
        await asyncio.to_thread(self._warm, [pool_topic(n) for n in new])
        self._known.update(new)
        log.info("topic metadata fetched for %d pools", len(new))
        return len(new)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.run_once()
            except Exception as exc:  # Postgres or the broker away: the first publish looks the topic up itself
                log.warning("topic metadata warm-up failed: %r", exc)
            try:
                await asyncio.wait_for(stop.wait(), self.config.interval_sec)
            except TimeoutError:
                pass
