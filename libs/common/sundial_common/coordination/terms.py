"""What a leadership term is and how leases are sized: :class:`Term`, :class:`LeadershipConfig`, the process's
:class:`SharedLease` a term may ride on, and the errors an election raises (:mod:`.leadership` explains the whole)."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Protocol

import aetcd

__all__ = ["MIN_TTL_SEC", "LeadershipConfig", "LeadershipStopped", "NoLease", "SharedLease", "Term"]

MIN_TTL_SEC = 2.0
"""etcd (3.4 defaults) rounds shorter leases up to about 2 s; a shorter ttl would make our trust window a lie."""


class SharedLease(Protocol):
    """The process's lease, renewed by its owner for every key on it (``ReplicaRegistration``).

    ``lease_id`` is None while there is none (registering, deregistered); ``renewed_at`` is the
    ``time.monotonic()`` at which its last successful renewal (or grant) started; ``ttl`` is as granted;
    ``failing_since`` the ``time.monotonic()`` since which its renewals fail (None: the last one succeeded).
    """

    lease_id: int | None
    renewed_at: float
    ttl: float
    failing_since: float | None

    def renewal(self) -> asyncio.Event:
        """An event set when the next renewal ends (succeeds or fails) or the lease changes."""
        ...


class NoLease(aetcd.ClientError):  # type: ignore[misc]  # aetcd ships no type information
    """The process's shared lease is not granted (yet): retried like any etcd error."""


class LeadershipStopped(Exception):
    """``acquire()`` was called on, or interrupted by, a stopped ``ShardLeadership``."""


@dataclass(frozen=True)
class Term:
    """One holder's leadership of one shard. ``revision`` is the leader key's create revision (not a fencing
    token: see the module docstring)."""

    shard: int
    holder: str
    revision: int
    lease_id: int


@dataclass(frozen=True)
class LeadershipConfig:
    """How leases are sized and where leader keys live.

    ttl_sec: lease time-to-live; a crashed leader is replaced after at most about this long.
        At least 2.0 (etcd's minimum lease). Renewals happen every ``ttl_sec / 3``.
    margin_sec: how long before the earliest possible lease expiry a leader stops trusting itself.
        Must leave a trust window (``ttl_sec - margin_sec``) longer than the renewal interval.
    key_prefix: etcd prefix of the leader keys; the key of shard N is ``f"{key_prefix}{N}/leader"``.
    fenced: the holder's writes are fenced in Postgres (a term's token from ``take_shard``): its term then
        outlives an unreachable etcd and ends only when etcd answers that it is over (module docstring).
    """

    ttl_sec: float = 5.0
    margin_sec: float = 1.0
    key_prefix: str = "/sundial/shards/"
    fenced: bool = False

    def __post_init__(self) -> None:
        for name in ("ttl_sec", "margin_sec"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
        if self.ttl_sec < MIN_TTL_SEC:
            raise ValueError(
                f"ttl_sec must be at least {MIN_TTL_SEC} seconds (etcd silently rounds shorter leases up, "
                f"so the trust window would not match the real lease), got {self.ttl_sec!r}"
            )
        if self.margin_sec <= 0:
            raise ValueError(
                f"margin_sec must be > 0: it covers clock drift and the time between checking "
                f"trusted() and writing, got {self.margin_sec!r}"
            )
        if self.trust_window_sec <= self.renew_interval_sec:
            raise ValueError(
                f"margin_sec={self.margin_sec!r} leaves a trust window of {self.trust_window_sec:.2f} s, "
                f"not longer than the renewal interval ttl_sec/3 = {self.renew_interval_sec:.2f} s: the "
                f"leader would lose trust before it could renew; use margin_sec < "
                f"{self.ttl_sec - self.renew_interval_sec:.2f} or a larger ttl_sec"
            )
        if not isinstance(self.key_prefix, str) or not self.key_prefix.startswith("/"):
            raise ValueError(f"key_prefix must be a string starting with '/', got {self.key_prefix!r}")
        if not self.key_prefix.endswith("/"):
            raise ValueError(
                f"key_prefix must end with '/' so that shard 1's key is not a prefix of shard 10's, "
                f"got {self.key_prefix!r} (did you mean {self.key_prefix + '/'!r}?)"
            )

    @property
    def renew_interval_sec(self) -> float:
        return self.ttl_sec / 3

    @property
    def trust_window_sec(self) -> float:
        return self.ttl_sec - self.margin_sec

    def leader_key(self, shard: int) -> str:
        return f"{self.key_prefix}{shard}/leader"
