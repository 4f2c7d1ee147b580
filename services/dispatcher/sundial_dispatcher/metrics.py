"""What a dispatcher records in the process's metrics registry (:mod:`sundial_common.observability.metrics`).

- ``sundial_executions_dispatched_total{tenant,pool}``: executions a shard's leader committed as PENDING and
  handed to their pool — first attempts (:mod:`sundial_dispatcher.dispatcher`) and retries
  (:mod:`sundial_dispatcher.retries`) — counted once per batch, whether or not the publish succeeded (a
  failed publish is the sweeper's to send again, not a second dispatch).
- ``sundial_missed_fires_total{tenant}``: occurrences the catch-up policy gave up on, per batch.
- ``sundial_dispatch_batch_size{shard}`` (passes that claimed something) and
  ``sundial_dispatch_pass_duration_seconds{shard}`` (every pass): :class:`ShardPassMetrics`, by the leader work.
- ``sundial_shard_leader{shard,replica}`` and ``sundial_shard_fence_token{shard}``: :class:`Leadership`, by the
  shard's campaign: 1 and the term's token while this replica leads, 0 and no token otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import Counter
from sundial_common.observability.metrics import (
    DISPATCH_BATCH_SIZE,
    DISPATCH_PASS_DURATION,
    EXECUTIONS_DISPATCHED,
    MISSED_FIRES,
    SHARD_FENCE_TOKEN,
    SHARD_LEADER,
    Children,
)

_dispatched: Children[Counter] = Children(EXECUTIONS_DISPATCHED)
_missed: Children[Counter] = Children(MISSED_FIRES)


def count_dispatched(executions: Iterable[tuple[str, str]]) -> None:
    """Count one batch of dispatched executions, given as (tenant, pool) each."""
    counts: dict[tuple[str, str], int] = {}
    for key in executions:
        counts[key] = counts.get(key, 0) + 1
    for key, n in counts.items():
        _dispatched(*key).inc(n)


def count_missed(by_tenant: Mapping[str, int]) -> None:
    for tenant, n in by_tenant.items():
        _missed(tenant).inc(n)


class ShardPassMetrics:
    """The pass metrics of one shard, children bound once per term."""

    def __init__(self, shard: int) -> None:
        self._batch = DISPATCH_BATCH_SIZE.labels(str(shard))
        self._duration = DISPATCH_PASS_DURATION.labels(str(shard))

    def passed(self, seconds: float, claimed: int) -> None:
        self._duration.observe(seconds)
        if claimed:
            self._batch.observe(claimed)


class Leadership:
    """``sundial_shard_leader`` and ``sundial_shard_fence_token`` of one shard as seen by this replica."""

    def __init__(self, shard: int, replica: str) -> None:
        self.shard = str(shard)
        self._leader = SHARD_LEADER.labels(self.shard, replica)
        self._leader.set(0)

    def leading(self, token: int | None = None) -> None:
        """This replica leads the shard; ``token``: the fencing token its term took in Postgres, once known."""
        self._leader.set(1)
        if token is not None:
            SHARD_FENCE_TOKEN.labels(self.shard).set(token)

    def stepped_down(self) -> None:
        self._leader.set(0)
        try:
            SHARD_FENCE_TOKEN.remove(self.shard)
        except KeyError:
            pass
