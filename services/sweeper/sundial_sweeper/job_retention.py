"""Job retention: jobs that ended go once none of their executions can remain.

A job that ended — COMPLETED (a one-shot job that fired, a recurring one whose schedule ran out) or CANCELLED
(of any type: one-shot, recurring, DEPENDENT) — fires no more, and nothing but the API reads it. A busy deployment
makes millions of one-shot jobs a day, and a tenant creating and cancelling recurring or DEPENDENT jobs
programmatically thousands; kept forever, they grew ``jobs``, its indexes and the hydrator's scans without end.
The active sweeper runs this loop (``job-retention``) beside the partition loop, and each pass deletes such jobs,
oldest first, that last changed a day (``margin_days``) before the oldest day of ``executions`` left
(:meth:`~sundial_common.stores.partitions.PartitionStore.executions_begin`): every execution of such a job was
created by then (by the statement that ended it or a later manual run, which moves the job too, or earlier), so
its day is gone and the worker's start, which joins the job, can never meet it. A day the partition loop keeps
(an open execution, an unpublished dead letter, events not replicated) holds the horizon back, so its jobs stay
too. The retention is therefore ``SUNDIAL_EXECUTION_RETENTION_DAYS`` (+ about a day); with 0 (keep forever) no
day is dropped and no job goes.

Kept whatever their age: a job a dependency names as a parent (it goes in a later pass, once its children have),
a job with a manual run pending, one with a backfill running or finished since the horizon (a backfill's
executions do not move the job), and any job of a database whose executions still have the legacy partition of
an upgrade (it has no lower bound). A job goes with what hangs off it: its edges as a DEPENDENT child
(``job_dependencies``), its triggers and its backfills.
A pruned job's ``GET`` is a 404, like a job that never existed (its backfills' too); its audit trail stays until
its own retention.
The triggers a DEPENDENT job consumed (``job_triggers``, one per parent execution that fired it) go by the same
horizon: the parent execution that made one, and the execution it fired, are gone by then.
A pass deletes in batches of ``batch_size`` (one short transaction each) and at most ``max_batches`` of them,
so a first pass over a large backlog spreads over several intervals instead of holding Postgres busy.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sundial_common.stores.dependencies import DependencyStore
from sundial_common.stores.jobs import JobStore
from sundial_common.stores.partitions import PartitionStore

log = logging.getLogger("sundial.job_retention")


@dataclass(frozen=True, slots=True)
class JobRetentionConfig:
    #: Seconds between passes.
    interval_sec: float = 600.0
    #: Jobs deleted per transaction.
    batch_size: int = 1000
    #: Batches per pass at most (the rest waits for the next pass).
    max_batches: int = 1000
    #: How long before the oldest day of executions left a job must have ended.
    margin_days: float = 1.0

    def __post_init__(self) -> None:
        for name in ("interval_sec", "batch_size", "max_batches"):
            if not getattr(self, name) > 0:
                raise ValueError(f"JobRetentionConfig.{name} must be positive")
        if self.margin_days < 0:
            raise ValueError("JobRetentionConfig.margin_days must not be negative")


@dataclass(frozen=True, slots=True)
class JobRetentionPass:
    jobs: int = 0
    triggers: int = 0


class JobRetention:
    """One pass (:meth:`run_once`) deletes the jobs that ended, and the triggers consumed, before the horizon."""

    def __init__(
        self, jobs: JobStore, dependencies: DependencyStore, partitions: PartitionStore, config: JobRetentionConfig
    ) -> None:
        self._jobs = jobs
        self._dependencies = dependencies
        self._partitions = partitions
        self.config = config

    async def run_once(self) -> JobRetentionPass:
        begin = await self._partitions.executions_begin()
        if begin is None:
            return JobRetentionPass()
        before = begin - timedelta(days=self.config.margin_days)
        done = JobRetentionPass(
            jobs=await self._batches(self._jobs.prune_ended_jobs, before),
            triggers=await self._batches(self._dependencies.prune_consumed_triggers, before),
        )
        if done.jobs or done.triggers:
            log.info(
                "deleted %d jobs that ended and %d triggers consumed before %s",
                done.jobs,
                done.triggers,
                before.isoformat(),
            )
        return done

    async def _batches(self, prune: Callable[[datetime, int], Awaitable[int]], before: datetime) -> int:
        """``prune`` in batches until one comes back short, ``max_batches`` at most; how many went."""
        pruned = 0
        for _ in range(self.config.max_batches):
            went = await prune(before, self.config.batch_size)
            pruned += went
            if went < self.config.batch_size:
                break
        return pruned
