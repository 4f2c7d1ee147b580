"""The ingester: drains Postgres' ``execution_events`` outbox into the ClickHouse replica, a batch per pass.

One pass reads the oldest events (thousands at a time), turns each into a replica row (lateness, duration
and error class computed here, once), inserts them into ClickHouse in one insert per table, and only then
deletes exactly those ids from the outbox. A crash between the insert and the delete re-sends the batch on
the next pass, which the replica's ReplacingMergeTree tables collapse: at-least-once delivery, exactly-once
counts. Nothing is held in memory between passes, so ``kill -9`` loses nothing.

Postgres' retention drops whole days of executions (the sweeper's partition loop, :mod:`sundial_sweeper.partitions`),
never a day whose events are still in the outbox: from then on their history is in ClickHouse only.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prometheus_client import Gauge, Histogram
from sundial_common.clock import Clock, SystemClock
from sundial_common.crashpoints import crash_point
from sundial_common.stores.analytics import AnalyticsStore
from sundial_common.stores.types import Record

from sundial_analytics.replica import Replica

log = logging.getLogger("sundial.analytics")

#: Events after which the execution will not change again unless retried by hand.
FINAL_KINDS = frozenset({"finished", "dead_lettered", "cancelled", "skipped"})

REPLICATION_LAG = Histogram(
    "sundial_analytics_replication_lag_seconds",
    "Seconds from a final-state event's Postgres transaction to its insert into ClickHouse.",
    buckets=(0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0),
)
OUTBOX_ROWS = Gauge("sundial_analytics_outbox_rows", "Events read by the last ingest pass (a full batch: backlog).")

_ERROR_CLASS = re.compile(r"^([A-Za-z_][\w.]{0,99})(?::|$)")


def error_class(error: str | None) -> str:
    """``ValueError: boom`` → ``ValueError``; free text → ``Error``; no error → empty."""
    if not error:
        return ""
    match = _ERROR_CLASS.match(error)
    return match.group(1) if match else "Error"


def _ms(later: datetime | None, earlier: datetime | None) -> int | None:
    if later is None or earlier is None:
        return None
    return max(0, int((later - earlier).total_seconds() * 1000))


def replica_row(event: Record, first_start: datetime | None) -> tuple[Any, ...]:
    """One outbox row as a replica row, in :data:`~sundial_analytics.replica.EVENT_COLUMNS` order.

    Lateness: the first attempt's start after the (jittered) fire time, as the workers' lateness metric
    measures it. Duration: the latest attempt's, once it has finished.
    """
    fire_at = event["fire_at"] or event["scheduled_for"]
    started = first_start if first_start is not None else (event["started_at"] if event["attempt"] == 1 else None)
    return (
        event["id"],
        event["at"],
        event["kind"],
        event["tenant_id"],
        event["job_id"],
        event["execution_id"],
        event["attempt"],
        event["state"],
        event["pool"],
        event["handler"],
        event["scheduled_for"],
        fire_at,
        event["created_at"],
        event["started_at"],
        event["finished_at"],
        _ms(started, fire_at),
        _ms(event["finished_at"], event["started_at"]),
        event["worker_id"] or "",
        error_class(event["error"]),
    )


@dataclass(frozen=True, slots=True)
class IngestConfig:
    """``batch_size``: events per pass (one ClickHouse insert per table); ``interval_sec``: the pause after
    a pass that found less than a full batch (a full one goes again at once); ``idle_interval_sec``: the
    longest pause while passes find nothing (it doubles from ``interval_sec``, see ``service.every``; never
    shorter than ``interval_sec``)."""

    batch_size: int = 10_000
    # A pass costs ~20 ms of chDB (a part per insert) plus three Postgres round trips whatever its size: at
    # 0.5 s that was a quarter of the service's CPU at W3 1,500/s (issue 18). 1 s halves it; the freshness
    # target (P95 < 5 s from the final state's commit) keeps a wide margin.
    interval_sec: float = 1.0
    idle_interval_sec: float = 4.0

    def __post_init__(self) -> None:
        if not 1 <= self.batch_size <= 1_000_000:
            raise ValueError("batch_size must be between 1 and 1,000,000")
        if self.interval_sec <= 0 or self.idle_interval_sec <= 0:
            raise ValueError("interval_sec and idle_interval_sec must be positive")


@dataclass(frozen=True, slots=True)
class IngestPass:
    events: int = 0
    deleted: int = 0

    def full(self, config: IngestConfig) -> bool:
        return self.events >= config.batch_size


class Ingester:
    """Drains the outbox into the replica: :meth:`run_once` is one batch."""

    def __init__(
        self, store: AnalyticsStore, replica: Replica, config: IngestConfig, *, clock: Clock | None = None
    ) -> None:
        self._store = store
        self._replica = replica
        self.config = config
        self._clock = clock or SystemClock()

    async def run_once(self) -> IngestPass:
        events = await self._store.oldest_events(self.config.batch_size)
        OUTBOX_ROWS.set(len(events))
        if not events:
            return IngestPass()
        retried = list({event["execution_id"] for event in events if event["attempt"] > 1})
        first_starts = await self._store.first_starts(retried)
        await self._replica.insert([replica_row(e, first_starts.get(e["execution_id"])) for e in events])
        crash_point("analytics.after_insert")
        now = self._clock.now()
        for event in events:
            if event["kind"] in FINAL_KINDS:
                REPLICATION_LAG.observe(max(0.0, (now - event["at"]).total_seconds()))
        deleted = await self._store.delete_events([event["id"] for event in events])
        return IngestPass(events=len(events), deleted=deleted)
