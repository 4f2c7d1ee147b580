"""``client.replays``: replay a window of a pool's Kafka messages into a staging pool, and follow replays.

``client.replays.create(source_pool=…, window_from=…, window_to=…, target_pool=…)`` asks for one; ``watch``
follows it until it ends. Written once, over asyncio; the blocking client runs these same methods on its loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from sundial_client import calls
from sundial_client.caller import Caller, check_page_size, pages
from sundial_client.models import Replay, ReplayRun
from sundial_client.models.replays import (
    FINAL_STATES,
    ReplayFilterView,
    ReplayList,
    ReplayPartition,
    ReplayRunList,
    ReplayState,
)

# The replay shapes were importable from here before they joined the other views in sundial_client.models.
ReplayFilter = ReplayFilterView
ReplayPage = ReplayList
ReplayRunPage = ReplayRunList

__all__ = [
    "FINAL_STATES",
    "AsyncReplays",
    "Replay",
    "ReplayFilter",
    "ReplayPage",
    "ReplayPartition",
    "ReplayRun",
    "ReplayRunPage",
    "ReplayState",
]

#: The largest page of a replay's runs.
MAX_RUNS_PAGE = 1000


class AsyncReplays:
    """``client.replays``."""

    def __init__(self, client: Caller) -> None:
        self.client = client

    async def create(self, /, **fields: Any) -> Replay:
        """Ask for a replay (see :func:`~sundial_client.calls.create_replay` for the fields); it starts PENDING."""
        return await self.client.call(calls.create_replay(**fields))

    async def get(self, replay_id: str) -> Replay:
        return await self.client.call(calls.get_replay(replay_id))

    async def cancel(self, replay_id: str) -> Replay:
        """PENDING: CANCELLED at once; RUNNING: stops at its next batch."""
        return await self.client.call(calls.cancel_replay(replay_id))

    def list(self, *, page_size: int = 50) -> AsyncIterator[Replay]:
        size = check_page_size(min(page_size, calls.MAX_PAGE))
        return pages(self.client, lambda cursor: calls.list_replays(cursor=cursor, limit=size))

    def runs(self, replay_id: str, *, page_size: int = 200) -> AsyncIterator[ReplayRun]:
        size = check_page_size(min(page_size, MAX_RUNS_PAGE), MAX_RUNS_PAGE)
        return pages(self.client, lambda cursor: calls.replay_runs(replay_id, cursor=cursor, limit=size))

    async def watch(self, replay_id: str, *, poll_sec: float = 1.0) -> AsyncIterator[Replay]:
        """The replay now, then every ``poll_sec`` until it has ended."""
        while True:
            current = await self.get(replay_id)
            yield current
            if current.ended:
                return
            await self.client.sleep(poll_sec)
