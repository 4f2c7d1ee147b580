"""The sweeper: finds executions that fell between the cracks and sends them on again.

This pass covers the outbox side of DESIGN invariant 1: a PENDING execution whose Kafka message was
never published (the dispatcher died between commit and publish, or the publish failed), or was
published but never picked up (the broker restarted empty and lost it). Republishing is safe: the
worker's PENDING→RUNNING compare-and-swap lets only one delivery run.

Several sweepers may run at once; at worst a message is published twice, which the CAS absorbs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from sundial_common.broker import Publisher
from sundial_common.clock import Clock, SystemClock
from sundial_common.messages import ExecutionMessage
from sundial_common.store import Record, Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweeperConfig:
    #: A PENDING execution not published this many seconds after dispatch is published again.
    unpublished_after_sec: float = 5.0
    #: A PENDING execution published this long ago and still not started is published again.
    unstarted_after_sec: float = 60.0
    #: Rows per pass.
    batch_size: int = 1000
    #: Seconds between passes.
    interval_sec: float = 2.0

    def __post_init__(self) -> None:
        if self.unpublished_after_sec <= 0 or self.unstarted_after_sec <= 0 or self.interval_sec <= 0:
            raise ValueError("sweeper thresholds and interval must be > 0")
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")


@dataclass(frozen=True)
class SweepResult:
    republished: int = 0
    publish_failed: int = 0


def _message(row: Record) -> ExecutionMessage:
    return ExecutionMessage(
        execution_id=str(row["id"]),
        job_id=str(row["job_id"]),
        tenant_id=row["tenant_id"],
        pool=row["pool"],
        handler=row["handler"],
        attempt=row["attempt"],
        fence_token=row["fence_token"],
        scheduled_for=row["scheduled_for"].isoformat(),
        timeout_sec=row["timeout_sec"],
        payload=row["payload"],
        traceparent=row["traceparent"],
    )


class Sweeper:
    def __init__(self, store: Store, publisher: Publisher, config: SweeperConfig, clock: Clock | None = None):
        self.store = store
        self.publisher = publisher
        self.config = config
        self.clock = clock or SystemClock()

    async def run_once(self) -> SweepResult:
        now = self.clock.now()
        rows = await self.store.stale_pending(
            now - timedelta(seconds=self.config.unpublished_after_sec),
            now - timedelta(seconds=self.config.unstarted_after_sec),
            self.config.batch_size,
        )
        if not rows:
            return SweepResult()
        messages = [_message(row) for row in rows]
        errors = await self.publisher.publish(messages)
        sent = [row["id"] for row, error in zip(rows, errors, strict=True) if error is None]
        await self.store.republished(sent)
        failed = len(rows) - len(sent)
        log.warning("republished %d stale PENDING executions (%d failed, retried next pass)", len(sent), failed)
        return SweepResult(republished=len(sent), publish_failed=failed)
