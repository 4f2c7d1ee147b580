"""The offset committer's lag sampling: a quiet pool is asked for its lag seldom, a busy or lagging one often."""

from __future__ import annotations

from typing import cast

from sundial_worker.commits import CommitConfig, OffsetCommitter
from sundial_worker.consumer import ExecutionConsumer
from sundial_worker.inflight import WorkerStats

# Every pass samples unless the pool is quiet (then once an hour: never within a test).
CONFIG = CommitConfig(commit_interval_sec=0.5, lag_interval_sec=1e-9, quiet_lag_interval_sec=3600.0)


class Consumer:
    """What the committer calls: commit() moves nothing; lag() answers ``self.lag_now`` and counts the asks."""

    def __init__(self) -> None:
        self.lag_now: dict[int, int] = {0: 0, 1: 0}
        self.asked = 0

    async def commit(self) -> int:
        return 0

    async def lag(self) -> dict[int, int]:
        self.asked += 1
        return dict(self.lag_now)


async def test_a_quiet_pool_is_not_asked_for_its_lag_again_until_it_consumes_or_lags() -> None:
    consumer, stats = Consumer(), WorkerStats()
    committer = OffsetCommitter(cast(ExecutionConsumer, consumer), CONFIG, stats=stats, pool="p")

    await committer.run_once()
    assert consumer.asked == 1, "the first pass samples"
    await committer.run_once()
    assert consumer.asked == 1, "no lag and nothing consumed since: quiet"

    stats.consumed += 1
    consumer.lag_now = {0: 3, 1: 0}
    await committer.run_once()
    assert consumer.asked == 2, "consumed since the last sample: sampled again"
    await committer.run_once()
    assert consumer.asked == 3, "the last sample found lag: sampled every pass"

    consumer.lag_now = {0: 0, 1: 0}
    await committer.run_once()
    await committer.run_once()
    assert consumer.asked == 4, "caught up, and nothing consumed since: quiet again"
