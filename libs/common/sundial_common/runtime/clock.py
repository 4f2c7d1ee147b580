"""The one place processes read time from, and sleep on it, so time logic can be tested without waiting."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Wall-clock time, timezone-aware UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; never goes backwards (use for timeouts and leases)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of :meth:`monotonic` time (a fake clock wakes its sleepers when it is moved)."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


def to_ms(instant: datetime) -> int:
    """Epoch milliseconds: the hot window's ZSET score."""
    return int(instant.timestamp() * 1000)


def from_ms(ms: float) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)
