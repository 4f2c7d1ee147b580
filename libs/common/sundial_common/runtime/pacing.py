"""Pacing a long operation to a rate: the replays' re-publishing and the bulk operations' actions.

Work goes in batches of a tenth of a second's worth, each when the running total allows it, so the rate holds over
any stretch longer than that; an operation that waited for its turn (another's turn, a slow server, a restart)
paces from then on instead of bursting to catch up.
"""

from __future__ import annotations

import asyncio
import time


class Pacer:
    """Holds work to ``rate`` items a second: each batch goes when the running total allows it."""

    #: Batches are a tenth of a second's worth, so no burst is longer than that.
    interval_sec = 0.1

    def __init__(self, rate: float) -> None:
        if rate <= 0:
            raise ValueError(f"a rate must be > 0, not {rate}")
        self.rate = rate
        self._origin: float | None = None
        self._sent = 0

    def chunk(self) -> int:
        """Items per batch."""
        return max(1, int(self.rate * self.interval_sec))

    async def wait(self, count: int) -> None:
        """Wait until ``count`` more items may go: the first batch at once, then ``rate`` a second."""
        now = time.monotonic()
        due = now if self._origin is None else self._origin + self._sent / self.rate
        if self._origin is None or now - due > self.interval_sec:
            # The first batch, or late by more than a batch: pace from now rather than burst to catch up.
            self._origin, self._sent, due = now, 0, now
        if due > now:
            await asyncio.sleep(due - now)
        self._sent += count
