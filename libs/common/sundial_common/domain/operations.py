"""What every long-running operation (replays, backfills, bulk operations) has in common, as pure rules: its
lifecycle, its progress and the time it still needs.

Each operation is a durable row that a process moves through ``PENDING``/``PREPARING`` → ``RUNNING`` → a final
state, counting what it did, cancellable at any point and resumed where its committed progress stands after a
crash. How each one selects and acts differs; how it reports does not, and is here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

#: States no operation leaves.
FINAL_STATES = frozenset({"SUCCEEDED", "DONE", "FAILED", "CANCELLED"})


@dataclass(frozen=True, slots=True)
class Progress:
    """How far an operation is: ``processed`` of ``total`` (None while its selection is not fixed yet)."""

    total: int | None
    processed: int
    started_at: datetime | None
    finished_at: datetime | None = None

    @property
    def remaining(self) -> int | None:
        return None if self.total is None else max(0, self.total - self.processed)

    def rate(self, now: datetime) -> float | None:
        """Items a second since it started (None before it started or processed anything)."""
        if self.started_at is None or self.processed == 0:
            return None
        seconds = ((self.finished_at or now) - self.started_at).total_seconds()
        return self.processed / seconds if seconds > 0 else None

    def eta(self, now: datetime) -> datetime | None:
        """When it should be done at the rate it has held so far: ``now`` once finished, None when unknown."""
        if self.finished_at is not None:
            return self.finished_at
        remaining, rate = self.remaining, self.rate(now)
        if remaining is None or rate is None:
            return None
        return now + timedelta(seconds=remaining / rate)
