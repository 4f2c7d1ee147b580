"""A job's retry policy and the backoff it implies: how long after a failed attempt the next one starts.

The policy is stored with the job as the client wrote it (camelCase JSON, ``retryPolicy``):
``{maxAttempts, backoff: FIXED | LINEAR | EXPONENTIAL, initialDelayMs, maxDelayMs, jitter}``. After attempt
``n`` fails, the base delay is ``initialDelayMs`` (FIXED), ``initialDelayMs × n`` (LINEAR) or
``initialDelayMs × 2^(n−1)`` (EXPONENTIAL), capped at ``maxDelayMs``.

Jitter is *equal jitter*: half the base delay is kept and the other half drawn uniformly, so a retry never
comes sooner than half its base delay (no tight loops) and a thousand executions that failed in the same
instant — a downstream outage — come back spread over half the delay instead of as one wave (the retry
storm). The randomness is injected, so tests pin it.

Whoever records a failure (the worker, the sweeper) computes the delay here and Postgres adds it to its own
``now()``: every machine agrees on when the retry is due, whatever its clock says.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

BACKOFFS = ("FIXED", "LINEAR", "EXPONENTIAL")
#: The API's defaults (``RetryPolicy`` in ``sundial_api.models.jobs``), for a policy stored without a field.
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_INITIAL_DELAY_MS = 30_000
DEFAULT_MAX_DELAY_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff: str = "EXPONENTIAL"
    initial_delay_ms: int = DEFAULT_INITIAL_DELAY_MS
    max_delay_ms: int = DEFAULT_MAX_DELAY_MS
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.backoff not in BACKOFFS:
            raise ValueError(f"backoff must be one of {', '.join(BACKOFFS)}; got {self.backoff!r}")
        if self.max_attempts < 1 or self.initial_delay_ms < 0 or self.max_delay_ms < 0:
            raise ValueError("maxAttempts must be >= 1 and delays >= 0")

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> RetryPolicy:
        """The policy as stored on a job; missing fields take the API's defaults, nonsense falls back to them."""
        data = data or {}
        try:
            return cls(
                max_attempts=int(data.get("maxAttempts", DEFAULT_MAX_ATTEMPTS)),
                backoff=str(data.get("backoff", "EXPONENTIAL")),
                initial_delay_ms=int(data.get("initialDelayMs", DEFAULT_INITIAL_DELAY_MS)),
                max_delay_ms=int(data.get("maxDelayMs", DEFAULT_MAX_DELAY_MS)),
                jitter=bool(data.get("jitter", True)),
            )
        except (TypeError, ValueError):
            # The API validated it on the way in; a row written some other way must not stop a retry.
            return cls()

    def base_delay_ms(self, failed_attempt: int) -> int:
        """The delay after attempt ``failed_attempt`` (1-based) failed, before jitter."""
        n = max(1, failed_attempt)
        if self.backoff == "FIXED":
            base = self.initial_delay_ms
        elif self.backoff == "LINEAR":
            base = self.initial_delay_ms * n
        else:
            # 2**(n-1) grows without bound; past the cap it no longer matters, so stop computing it.
            base = self.initial_delay_ms * (1 << min(n - 1, 62))
        return min(base, max(self.max_delay_ms, self.initial_delay_ms))

    def delay_ms(self, failed_attempt: int, rng: random.Random | None = None) -> int:
        """The delay before the next attempt, jittered (in ``[base/2, base]``) if the policy says so."""
        base = self.base_delay_ms(failed_attempt)
        if not self.jitter or base <= 1:
            return base
        half = base / 2
        return int(half + (rng or _RNG).uniform(0, half))


_RNG = random.Random()
