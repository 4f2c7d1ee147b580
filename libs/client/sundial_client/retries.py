"""When the client tries a request again, and how long it waits first.

Retried: a connection that failed or dropped (``httpx.TransportError``), 429, 502, 503, 504, and a 409
that carries ``Retry-After`` (a create whose ``Idempotency-Key`` is still being processed, a change that
raced a dispatch). Every Sundial operation is safe to repeat: creates carry an ``Idempotency-Key`` that
stays the same across the retries of one call (the server answers a repeat with the first answer and
creates nothing more), and every other change is idempotent on the server (pausing a paused job, asking
again to cancel or retry an execution, deleting a cancelled job all answer as the first time did).

The wait is capped exponential backoff with full jitter (a random delay between zero and
``min(cap, base × 2^(n−1))``), so many clients failing together do not come back together; a
``Retry-After`` header is honoured as given (bounded by ``max_retry_after``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})


@dataclass(frozen=True)
class Retries:
    """How a client retries. ``attempts`` counts the first try; 1 disables retries."""

    attempts: int = 5
    backoff_base_sec: float = 0.25
    backoff_cap_sec: float = 8.0
    max_retry_after_sec: float = 60.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, not {self.attempts}")
        if self.backoff_base_sec < 0 or self.backoff_cap_sec < 0:
            raise ValueError("backoff_base_sec and backoff_cap_sec must not be negative")

    def retryable(self, response: httpx.Response) -> bool:
        status = response.status_code
        return status in RETRYABLE_STATUSES or (status == 409 and "retry-after" in response.headers)

    def delay(self, failures: int, response: httpx.Response | None = None) -> float:
        """Seconds to wait after the ``failures``-th failed try (1 for the first)."""
        if response is not None:
            after = retry_after(response)
            if after is not None:
                return min(after, self.max_retry_after_sec)
        ceiling = min(self.backoff_cap_sec, self.backoff_base_sec * 2 ** (failures - 1))
        return self.rng.uniform(0, ceiling)


def retry_after(response: httpx.Response) -> float | None:
    """The ``Retry-After`` header in seconds (delta-seconds or an HTTP date); None if absent or unreadable."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
