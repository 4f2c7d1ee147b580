"""The partition loop: keeps the daily partitions of ``executions`` and ``execution_attempts`` a few days ahead of
the clock, and drops each day once it is past ``SUNDIAL_EXECUTION_RETENTION_DAYS``; the same for ``audit_log``'s
days and ``SUNDIAL_AUDIT_RETENTION_DAYS``.

The active sweeper runs it (``partitions``) beside its sweep. Each pass:

1. makes the partitions of today and the next ``ahead_days`` UTC days that do not exist. Executions are
   ranged on their id (a UUIDv7 minted at creation, migration 0018) and there is no default partition, so an
   execution created on a day without its partition could not be inserted: the week ahead is the margin for a
   sweeper that is down (the migration makes the first week itself);
2. drops each day whose range ended more than ``retention_days`` ago — a ``DROP TABLE`` of a day's executions
   and attempts instead of deleting their rows one by one — unless it still holds something that must outlive
   retention: an open execution (PENDING, RUNNING, a retry scheduled or held by a breaker), a dead letter not
   yet published to ``sundial.dlq``, or lifecycle events the analytics service has not replicated to ClickHouse
   yet. Such a day is kept and tried again next pass. What else names an execution (a job's triggers, a
   replay's runs, the audit log, ClickHouse's copy) keeps its own copy of what it needs and no foreign key.

``audit_log`` (migration 0020) is ranged on the time each row was written, one partition per UTC day: the same pass
makes its days ahead and drops each day once it ended ``audit_retention_days`` ago. Nothing else must outlive an
audit row, so an expired day always goes (the log stays append-only: no row is updated or deleted).

Creating or dropping a partition takes its parent table exclusively, so each runs with a short
``lock_timeout``: a pass that would wait behind busy writers gives up (counted as ``busy``) and the next one
tries again, instead of queueing every execution write behind it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta

from sundial_common.runtime.clock import Clock, SystemClock
from sundial_common.stores.partitions import Partition, PartitionStore

log = logging.getLogger("sundial.partitions")


@dataclass(frozen=True, slots=True)
class PartitionLoopConfig:
    #: Days a finished execution is kept (counted from the end of the UTC day it was created); 0 = forever.
    retention_days: float = 30.0
    #: Days an audit row is kept (counted from the end of the UTC day it was written); 0 = forever.
    audit_retention_days: float = 90.0
    #: Partitions made ahead of today, in days.
    ahead_days: int = 7
    #: Seconds between passes.
    interval_sec: float = 600.0
    #: How long a partition's creation or drop may wait for its parent's lock, milliseconds.
    lock_timeout_ms: int = 200

    def __post_init__(self) -> None:
        retentions = {"retention_days": self.retention_days, "audit_retention_days": self.audit_retention_days}
        for name, days in retentions.items():
            if days < 0:
                raise ValueError(f"PartitionLoopConfig.{name} must be 0 (keep forever) or positive")
        for name, value in (("ahead_days", self.ahead_days), ("interval_sec", self.interval_sec)):
            if not value > 0:
                raise ValueError(f"PartitionLoopConfig.{name} must be positive")
        if self.lock_timeout_ms < 1:
            raise ValueError("PartitionLoopConfig.lock_timeout_ms must be at least 1")


@dataclass(frozen=True, slots=True)
class PartitionPass:
    created: int = 0
    dropped: int = 0
    #: Expired days kept because something in them must stay (open, undelivered, unreplicated).
    kept: int = 0
    #: Creations or drops that gave up waiting for the lock (tried again next pass).
    busy: int = 0
    #: Days of ``audit_log`` made and dropped.
    audit_created: int = 0
    audit_dropped: int = 0


class PartitionLoop:
    """One pass (:meth:`run_once`) makes the coming days' partitions and drops the expired ones."""

    def __init__(self, store: PartitionStore, config: PartitionLoopConfig, *, clock: Clock | None = None) -> None:
        self._store = store
        self.config = config
        self._clock = clock or SystemClock()

    async def run_once(self) -> PartitionPass:
        # Days are UTC days (the partitions' ranges); the clock is timezone-aware UTC.
        now, store = self._clock.now(), self._store
        executions = await self._days(
            now, self.config.retention_days, store.add_partitions, store.partitions, store.drop_partition
        )
        audit = await self._days(
            now,
            self.config.audit_retention_days,
            store.add_audit_partitions,
            store.audit_partitions,
            store.drop_audit_partition,
        )
        return replace(
            executions, busy=executions.busy + audit.busy, audit_created=audit.created, audit_dropped=audit.dropped
        )

    async def _days(
        self,
        now: datetime,
        retention_days: float,
        add: Callable[[date, int, int], Awaitable[int | None]],
        listed: Callable[[], Awaitable[list[Partition]]],
        drop: Callable[[str, int], Awaitable[bool | None]],
    ) -> PartitionPass:
        """One table's days: the coming ones made, the expired ones dropped (or kept, if the drop says so)."""
        lock_timeout_ms = self.config.lock_timeout_ms
        made = await add(now.date(), self.config.ahead_days + 1, lock_timeout_ms)
        busy = int(made is None)
        dropped = kept = 0
        for partition in await self._expired(listed, retention_days, now):
            went = await drop(partition.name, lock_timeout_ms)
            if went is None:
                busy += 1
            elif went:
                dropped += 1
                log.info("dropped %s: its rows were written before %s", partition.name, partition.ends_at.isoformat())
            else:
                kept += 1
        return PartitionPass(created=made or 0, dropped=dropped, kept=kept, busy=busy)

    @staticmethod
    async def _expired(
        listed: Callable[[], Awaitable[list[Partition]]], retention_days: float, now: datetime
    ) -> list[Partition]:
        """The partitions (``listed`` oldest first) whose range ended more than ``retention_days`` before ``now``."""
        if retention_days <= 0:
            return []
        horizon = now - timedelta(days=retention_days)
        return list(itertools.takewhile(lambda p: p.ends_at <= horizon, await listed()))
