"""Committing Kafka offsets: only past messages whose outcome is in Postgres.

The :class:`OffsetCommitter` (loop ``commit``, every ``commit_interval_sec``) commits each partition's
contiguous acknowledged prefix (see :mod:`sundial_worker.offsets`), so the offset never passes a message
whose handler still runs or whose result is not written yet: after a crash everything from the first
unfinished message on is delivered again, and the start compare-and-swap turns the redeliveries of
finished executions into no-ops. Messages are acknowledged by admission (a lost start CAS, an
undecodable message) and by the outcome flusher (after the write). The last commit is the consumer's,
when the runtime closes it.

Every ``lag_interval_sec`` the pass also samples the consumer lag of each assigned partition into
``sundial_consumer_lag_messages{pool,partition}`` (one offsets request per partition, so not every commit);
while the pool is quiet — the last sample found no lag and nothing was consumed since — only every
``quiet_lag_interval_sec``: an idle ``make up`` sent the broker 3.6 of those requests a second to learn that
nothing was behind. A backlog that builds up meanwhile (a consumer that stopped fetching) is seen within that
interval, well inside the lag alert's 5 minutes; one that is being consumed is sampled every ``lag_interval_sec``.

The loop sleeps first, then commits; like the heartbeat loop it lets an unexpected error fail the runtime
instead of :func:`sundial_common.runtime.service.every`'s log-and-retry (the consumer already logs and retries a
failed commit itself).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from confluent_kafka import KafkaException

from sundial_worker.consumer import ExecutionConsumer
from sundial_worker.errors import check_seconds
from sundial_worker.inflight import WorkerStats
from sundial_worker.metrics import LagGauge

log = logging.getLogger("sundial.worker")


@dataclass(frozen=True, slots=True)
class CommitConfig:
    """How often offsets are committed. Validated at construction."""

    commit_interval_sec: float = 0.5
    """How often the acknowledged offset prefix is committed to Kafka."""
    lag_interval_sec: float = 5.0
    """How often the consumer lag per partition is sampled (sundial_consumer_lag_messages)."""
    quiet_lag_interval_sec: float = 60.0
    """How often instead while the last sample found no lag and nothing was consumed since."""

    def __post_init__(self) -> None:
        check_seconds(self, "commit_interval_sec", "lag_interval_sec", "quiet_lag_interval_sec")


class OffsetCommitter:
    """Commits the consumer's acknowledged offset prefix, partition by partition."""

    def __init__(self, consumer: ExecutionConsumer, config: CommitConfig, *, stats: WorkerStats, pool: str) -> None:
        self.config = config
        self._consumer = consumer
        self._stats = stats
        self._lag = LagGauge(pool)
        self._lag_sampled_at = float("-inf")
        self._quiet = False  # the last sample found no lag
        self._consumed_at_sample = 0  # stats.consumed when it was taken

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.config.commit_interval_sec)
            await self.run_once()

    async def run_once(self) -> int:
        """Commit each partition's acknowledged prefix; returns how many partitions moved."""
        moved = await self._consumer.commit()
        if moved:
            self._stats.commits += 1
        if self._lag_due():
            self._lag_sampled_at = time.monotonic()
            self._consumed_at_sample = self._stats.consumed
            try:
                lag = await self._consumer.lag()
            except KafkaException as exc:  # a broker that does not answer now is asked again next time
                log.warning("could not sample the consumer lag: %s", exc)
                self._quiet = False
            else:
                self._lag.update(lag)
                self._quiet = not any(lag.values())
        return moved

    def _lag_due(self) -> bool:
        quiet = self._quiet and self._stats.consumed == self._consumed_at_sample
        interval = self.config.quiet_lag_interval_sec if quiet else self.config.lag_interval_sec
        return time.monotonic() - self._lag_sampled_at >= interval
