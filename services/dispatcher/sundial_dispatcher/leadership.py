"""Shard leadership moved to :mod:`sundial_common.leadership` (the hydrator, the sweeper and the admin view
use it too); this name is kept so existing imports keep working."""

from sundial_common.leadership import (
    MIN_TTL_SEC,
    Clock,
    LeadershipConfig,
    LeadershipStopped,
    MonotonicClock,
    ShardLeadership,
    Term,
    first_of,
    run_as_leader,
)

__all__ = [
    "MIN_TTL_SEC",
    "Clock",
    "LeadershipConfig",
    "LeadershipStopped",
    "MonotonicClock",
    "ShardLeadership",
    "Term",
    "first_of",
    "run_as_leader",
]
