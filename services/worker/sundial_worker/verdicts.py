"""What a handler raises to say more than "failed": when to retry, not to retry, or that the work goes on elsewhere.

A handler that raises any other exception fails its attempt and the job's retry policy decides what follows. These
three change that, for the attempt they end:

- :class:`RetryAfter` — failed; the next attempt (if the policy has one left) comes ``delay_sec`` from now instead
  of after the policy's backoff (a receiver's ``Retry-After``).
- :class:`NoRetry` — failed for good: the execution is DEAD now, whatever attempts are left (a request the other
  side refused as malformed will be refused again).
- :class:`Accepted` — not over: the attempt stays RUNNING after the handler returns, its liveness held for
  ``hold_sec``, and someone else finishes it (an HTTP target's completion call); nobody does within that, and the
  sweeper treats the attempt as lost, or as timed out at the job's ``timeoutSec``.

Sundial's delivery workers raise them for the answers of HTTP targets (:mod:`sundial_worker.http_target`).
"""

from __future__ import annotations

#: The state of an attempt whose handler raised :class:`Accepted`: no outcome is written for it.
ACCEPTED = "ACCEPTED"


class RetryAfter(Exception):
    """Fail the attempt; retry after ``delay_sec`` (if the retry policy has an attempt left)."""

    def __init__(self, delay_sec: float, message: str) -> None:
        super().__init__(message)
        if delay_sec < 0:
            raise ValueError(f"delay_sec must be zero or more; got {delay_sec!r}")
        self.delay_sec = delay_sec


class NoRetry(Exception):
    """Fail the attempt and the execution: DEAD now, whatever attempts are left."""


class Accepted(Exception):
    """Leave the attempt RUNNING for someone else to finish within ``hold_sec``."""

    def __init__(self, hold_sec: float, message: str = "accepted") -> None:
        super().__init__(message)
        if hold_sec <= 0:
            raise ValueError(f"hold_sec must be positive; got {hold_sec!r}")
        self.hold_sec = hold_sec
