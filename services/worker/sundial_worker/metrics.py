"""What a worker records in the process's metrics registry (:mod:`sundial_common.observability.metrics`).

- **Dispatch lateness** (``sundial_dispatch_lateness_seconds{tenant,pool}``), at handler start: now minus the
  time the occurrence was due (its jittered fire time; the nominal ``scheduled_for`` for rows without one),
  with the execution's trace id as exemplar so a slow bucket links to a trace. First attempts only: a
  retry's start is late by its backoff on purpose, which is not the scheduler's lateness. A bucket shows only
  its latest exemplar, so each bucket of a series takes one at most every ``EXEMPLAR_EVERY_SEC``: setting one
  (prometheus-client validates its labels, builds it and takes a lock) cost twice the observation itself,
  ~7 of a worker's ~40 µs of Python per execution (``bench/workloads/worker_python.py``).
- **Execution duration** (``sundial_execution_duration_seconds{tenant,pool,handler}``): the handler's run
  time, observed when its task ends. ``handler`` is the handler's name only if this worker declares it;
  a message naming any other handler (a typo in a job, a handler removed since) is labelled ``other``, so
  job data cannot grow the label set.
- **Ended attempts** (finished by state, retries, dead letters):
:class:`~sundial_common.observability.metrics.AttemptsEnded`,
  fed by the outcome flusher with each batch Postgres accepted.
- **Consumer lag** (``sundial_consumer_lag_messages{pool,partition}``): sampled by the offset committer.

Children are bound once per label tuple (:class:`~sundial_common.observability.metrics.Children`): recording an
execution costs two dict lookups and two observations.
"""

from __future__ import annotations

import asyncio
import math
import time
from bisect import bisect_left
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Gauge, Histogram
from sundial_common.observability.metrics import (
    CONSUMER_LAG,
    DISPATCH_LATENESS,
    EXECUTION_DURATION,
    LATENESS_BUCKETS,
    Children,
)

from sundial_worker.sdk import Context

#: The handler label of a handler this worker does not declare.
OTHER_HANDLER = "other"
#: The shortest interval between two exemplars of one lateness bucket of one series.
EXEMPLAR_EVERY_SEC = 1.0


class ExecutionMetrics:
    """Lateness and duration of the handlers one worker runs for its pool."""

    def __init__(self, pool: str, handlers: frozenset[str]) -> None:
        self.pool = pool
        self.handlers = handlers
        self._lateness: Children[Histogram] = Children(DISPATCH_LATENESS)
        self._duration: Children[Histogram] = Children(EXECUTION_DURATION)
        #: Per tenant (this pool's lateness series): when each bucket (the last one is +Inf) last took an exemplar.
        self._exemplar_at: dict[str, list[float]] = {}

    def handler_label(self, handler: str) -> str:
        return handler if handler in self.handlers else OTHER_HANDLER

    def handler_started(self, ctx: Context, due: datetime | None, work: asyncio.Future[Any] | None) -> None:
        """Record the lateness of ``ctx``'s handler starting now, and its duration when ``work`` ends.

        ``due`` is when the occurrence was due (``ctx.scheduled_for`` if unknown); ``work`` None: no handler
        runs (this worker does not declare it), a zero duration under ``other``.
        """
        if ctx.attempt == 1:
            lateness = max(0.0, (datetime.now(UTC) - (due or ctx.scheduled_for)).total_seconds())
            exemplar = self._exemplar(ctx.tenant, lateness, ctx.trace_id) if ctx.trace_id else None
            self._lateness(ctx.tenant, self.pool).observe(lateness, exemplar)
        duration = self._duration(ctx.tenant, self.pool, self.handler_label(ctx.handler))
        if work is None:
            duration.observe(0.0)
            return
        started = time.perf_counter()
        work.add_done_callback(lambda _: duration.observe(time.perf_counter() - started))

    def _exemplar(self, tenant: str, lateness: float, trace_id: str) -> dict[str, str] | None:
        """The exemplar of this observation, unless its bucket of the tenant's series took one less than
        ``EXEMPLAR_EVERY_SEC`` ago (the bucket keeps that one)."""
        stamps = self._exemplar_at.get(tenant)
        if stamps is None:
            stamps = self._exemplar_at[tenant] = [-math.inf] * (len(LATENESS_BUCKETS) + 1)
        bucket = bisect_left(LATENESS_BUCKETS, lateness)  # the first bound >= lateness, as the histogram counts it
        now = time.monotonic()
        if now - stamps[bucket] < EXEMPLAR_EVERY_SEC:
            return None
        stamps[bucket] = now
        return {"trace_id": trace_id}


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
