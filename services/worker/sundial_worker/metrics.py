"""What a worker records in the process's metrics registry (:mod:`sundial_common.metrics`).

- **Dispatch lateness** (``sundial_dispatch_lateness_seconds{tenant,pool}``), at handler start: now minus the
  time the occurrence was due (its jittered fire time; the nominal ``scheduled_for`` for rows without one),
  with the execution's trace id as exemplar so a slow bucket links to a trace. First attempts only: a
  retry's start is late by its backoff on purpose, which is not the scheduler's lateness.
- **Execution duration** (``sundial_execution_duration_seconds{tenant,pool,handler}``): the handler's run
  time, observed when its task ends. ``handler`` is the handler's name only if this worker declares it;
  a message naming any other handler (a typo in a job, a handler removed since) is labelled ``other``, so
  job data cannot grow the label set.
- **Ended attempts** (finished by state, retries, dead letters): :class:`~sundial_common.metrics.AttemptsEnded`,
  fed by the outcome flusher with each batch Postgres accepted.
- **Consumer lag** (``sundial_consumer_lag_messages{pool,partition}``): sampled by the offset committer.

Children are bound once per label tuple (:class:`~sundial_common.metrics.Children`): recording an
execution costs two dict lookups and two observations.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Gauge, Histogram
from sundial_common.metrics import CONSUMER_LAG, DISPATCH_LATENESS, EXECUTION_DURATION, Children

from sundial_worker.sdk import Context

#: The handler label of a handler this worker does not declare.
OTHER_HANDLER = "other"


class ExecutionMetrics:
    """Lateness and duration of the handlers one worker runs for its pool."""

    def __init__(self, pool: str, handlers: frozenset[str]) -> None:
        self.pool = pool
        self.handlers = handlers
        self._lateness: Children[Histogram] = Children(DISPATCH_LATENESS)
        self._duration: Children[Histogram] = Children(EXECUTION_DURATION)

    def handler_label(self, handler: str) -> str:
        return handler if handler in self.handlers else OTHER_HANDLER

    def handler_started(self, ctx: Context, due: datetime | None, work: asyncio.Future[Any] | None) -> None:
        """Record the lateness of ``ctx``'s handler starting now, and its duration when ``work`` ends.

        ``due`` is when the occurrence was due (``ctx.scheduled_for`` if unknown); ``work`` None: no handler
        runs (this worker does not declare it), a zero duration under ``other``.
        """
        if ctx.attempt == 1:
            lateness = max(0.0, (datetime.now(UTC) - (due or ctx.scheduled_for)).total_seconds())
            exemplar = {"trace_id": ctx.trace_id} if ctx.trace_id else None
            self._lateness(ctx.tenant, self.pool).observe(lateness, exemplar)
        duration = self._duration(ctx.tenant, self.pool, self.handler_label(ctx.handler))
        if work is None:
            duration.observe(0.0)
            return
        started = time.perf_counter()
        work.add_done_callback(lambda _: duration.observe(time.perf_counter() - started))


class LagGauge:
    """``sundial_consumer_lag_messages`` of one pool: set per partition, series of revoked partitions removed."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self._children: Children[Gauge] = Children(CONSUMER_LAG)

    def update(self, lag: dict[int, int]) -> None:
        keys = [(self.pool, str(partition)) for partition in lag]
        self._children.forget(keys)
        for key, value in zip(keys, lag.values(), strict=True):
            self._children(*key).set(value)
