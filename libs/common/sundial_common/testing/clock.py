"""FakeClock: the one test clock — wall and monotonic time that move only when the test moves them."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

#: Where a FakeClock's wall time starts unless told otherwise: a fixed instant, so a test's dates repeat.
DEFAULT_START = datetime(2026, 1, 1, tzinfo=UTC)
#: Where its monotonic time starts: far from zero, so "never" (0.0) and "now" differ.
DEFAULT_MONOTONIC = 1000.0


class FakeClock:
    """A :class:`~sundial_common.runtime.clock.Clock` — and the leadership's sleeping clock — whose time moves
    only when the test says so.

    :meth:`advance` moves wall and monotonic time together and wakes every :meth:`sleep` whose time has come;
    :meth:`set` jumps the wall clock alone (as an NTP step would), leaving monotonic time where it is, since
    monotonic time never goes back. Code that takes a ``Callable[[], float]`` gets ``clock.monotonic``.
    """

    def __init__(self, start: datetime = DEFAULT_START, *, monotonic: float = DEFAULT_MONOTONIC) -> None:
        if start.tzinfo is None:
            raise ValueError("FakeClock: start must be timezone-aware (UTC), as Clock.now() is")
        self._wall = start
        self._monotonic = monotonic
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> datetime:
        return self._wall

    def monotonic(self) -> float:
        return self._monotonic

    async def sleep(self, seconds: float) -> None:
        """Return once the clock has been advanced by ``seconds`` (at once, after one loop turn, if ≤ 0)."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        entry = (self._monotonic + seconds, asyncio.get_running_loop().create_future())
        self._sleepers.append(entry)
        try:
            await entry[1]
        finally:
            self._sleepers.remove(entry)

    @property
    def sleepers(self) -> int:
        """How many :meth:`sleep` calls are waiting for the clock to move."""
        return len(self._sleepers)

    def advance(self, by: float | timedelta) -> None:
        """Move wall and monotonic time forward by ``by`` (seconds, or a timedelta) and wake the sleepers due."""
        seconds = by.total_seconds() if isinstance(by, timedelta) else float(by)
        if seconds < 0:
            raise ValueError(f"FakeClock.advance: time moves forward only (got {seconds} s); use set() for the wall")
        self._wall += timedelta(seconds=seconds)
        self._monotonic += seconds
        for deadline, waiter in self._sleepers:
            if deadline <= self._monotonic and not waiter.done():
                waiter.set_result(None)

    def set(self, instant: datetime) -> None:
        """Jump the wall clock to ``instant`` (either way); monotonic time and the sleepers stay as they are."""
        if instant.tzinfo is None:
            raise ValueError("FakeClock.set: the instant must be timezone-aware (UTC)")
        self._wall = instant
