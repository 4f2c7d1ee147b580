"""Prometheus metrics: the one registry every Sundial process records into, and how it is served.

Three things live here and nowhere else:

- :data:`REGISTRY`, the process's metrics registry. It is prometheus-client's default registry, so it
  already carries the process collector (``process_cpu_seconds_total``, ``process_resident_memory_bytes``,
  open file descriptors, start time) and the Python ones (``python_gc_*``, ``python_info``). A module that
  adds a metric declares it at import time with ``registry=REGISTRY`` and a name starting with ``sundial_``
  (Prometheus naming: base units in the name, ``_total`` for counters; never an execution or job id as a
  label).
- :class:`LoopMetrics`, how a background loop reports its passes. :func:`sundial_common.runtime.service.every` uses
  it for every named loop, so a loop built the usual way (a frozen config, ``run_once()`` returning counts,
  driven by ``every``) is measured without a line of its own: ``sundial_loop_passes_total{loop}``,
  ``sundial_loop_pass_errors_total{loop}``, ``sundial_loop_pass_duration_seconds{loop}`` and, for each count
  field of the result ``run_once()`` returned, ``sundial_loop_items_total{loop,item}`` (a sweeper pass that
  republished 3 executions adds 3 to ``{loop="sweep",item="republished"}``). A loop that is not driven by
  ``every`` calls :meth:`LoopMetrics.passed` / :meth:`LoopMetrics.failed` itself.
- the **catalogue**: every ``sundial_*`` metric a process records (below :class:`LoopMetrics`), declared
  here once so that dashboards and alert rules have one list to read, with :class:`Children` to bind label
  children once per label-value tuple (a hot loop pays a dict lookup, never ``labels()``), and
  :class:`AttemptsEnded`, how the worker and the sweeper count ended attempts the same way.
- :func:`exposition`, what ``/metrics`` answers (served by :mod:`sundial_common.observability.probes` in a
  process without an HTTP server of its own)
  (dispatcher, hydrator, sweeper, worker: on ``SUNDIAL_METRICS_PORT`` when set; see
  :mod:`sundial_common.runtime.instrumentation`). The API serves :func:`exposition` on its own port instead.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Final, Generic, TypeVar

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics import MetricWrapperBase

log = logging.getLogger(__name__)

#: The registry every Sundial metric is declared in and every ``/metrics`` endpoint serves.
REGISTRY: Final[CollectorRegistry] = prometheus_client.REGISTRY

PROCESS = Info(
    "sundial_process",
    "Which Sundial service this process is and its instance id (a series that stops reporting is a dead process).",
    registry=REGISTRY,
)
LOOP_PASSES = Counter("sundial_loop_passes", "Passes of a background loop that completed.", ["loop"], registry=REGISTRY)
LOOP_ERRORS = Counter(
    "sundial_loop_pass_errors",
    "Passes of a background loop that raised (logged and retried).",
    ["loop"],
    registry=REGISTRY,
)
LOOP_DURATION = Histogram(
    "sundial_loop_pass_duration_seconds",
    "Wall time of one pass of a background loop, failed passes included.",
    ["loop"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=REGISTRY,
)
LOOP_ITEMS = Counter(
    "sundial_loop_items",
    "What the passes of a background loop did, by the count fields its run_once() result returned.",
    ["loop", "item"],
    registry=REGISTRY,
)


def pass_counts(result: object) -> dict[str, int]:
    """The counts a ``run_once()`` result carries: the int fields of a dataclass, an int (``items``), a mapping.

    Anything else (``None``, a bool "did work" flag) carries no counts. Field names become label values,
    so they are few and fixed by the code — never data.
    """
    if isinstance(result, bool) or result is None:
        return {}
    if isinstance(result, int):
        return {"items": result}
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        return {
            f.name: value
            for f in dataclasses.fields(result)
            if isinstance(value := getattr(result, f.name), int) and not isinstance(value, bool)
        }
    if isinstance(result, Mapping):
        return {str(k): v for k, v in result.items() if isinstance(v, int) and not isinstance(v, bool)}
    return {}


class LoopMetrics:
    """The pass metrics of one named loop (label children bound once: a busy loop pays no lookup per pass)."""

    def __init__(self, loop: str) -> None:
        self.loop = loop
        self._passes = LOOP_PASSES.labels(loop=loop)
        self._errors = LOOP_ERRORS.labels(loop=loop)
        self._duration = LOOP_DURATION.labels(loop=loop)
        self._items: dict[str, Counter] = {}

    def passed(self, seconds: float, result: object = None) -> None:
        """Record a completed pass, its duration and the counts ``result`` carries."""
        self._passes.inc()
        self._duration.observe(seconds)
        for item, count in pass_counts(result).items():
            if count <= 0:
                continue
            counter = self._items.get(item)
            if counter is None:
                counter = self._items[item] = LOOP_ITEMS.labels(loop=self.loop, item=item)
            counter.inc(count)

    def failed(self, seconds: float) -> None:
        """Record a pass that raised."""
        self._errors.inc()
        self._duration.observe(seconds)


# --- the catalogue ------------------------------------------------------------------------------------
# Label values are bounded: ``tenant`` comes from job rows (the tenants of the tokens that created them),
# ``pool`` from job targets, ``shard`` from 0..SUNDIAL_SHARDS-1, ``handler`` only for handlers the recording
# worker declares (anything else is "other"), ``state``/``reason``/``type`` from fixed sets, ``route`` from
# the API's path templates. Never an execution or job id.

#: Seconds from handler start back to when the occurrence was due (its jittered fire time).
LATENESS_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
DURATION_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
BATCH_BUCKETS: Final = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)

DISPATCH_LATENESS = Histogram(
    "sundial_dispatch_lateness_seconds",
    "Handler start minus the occurrence's due time (first attempts), with the execution's trace id as exemplar.",
    ["tenant", "pool"],
    buckets=LATENESS_BUCKETS,
    registry=REGISTRY,
)
EXECUTIONS_DISPATCHED = Counter(
    "sundial_executions_dispatched",
    "Executions committed and handed to their pool by a dispatcher (first attempts and retries).",
    ["tenant", "pool"],
    registry=REGISTRY,
)
EXECUTIONS_FINISHED = Counter(
    "sundial_executions_finished",
    "Executions ended, by final state (SUCCEEDED, FAILED, TIMED_OUT, CANCELLED, DEAD); retried attempts excluded.",
    ["tenant", "pool", "state"],
    registry=REGISTRY,
)
EXECUTION_DURATION = Histogram(
    "sundial_execution_duration_seconds",
    "Handler run time of one attempt (handlers the worker does not declare are labelled other).",
    ["tenant", "pool", "handler"],
    buckets=DURATION_BUCKETS,
    registry=REGISTRY,
)
RETRIES = Counter(
    "sundial_retries",
    "Retries scheduled after a failed, timed-out or lost attempt.",
    ["tenant", "pool"],
    registry=REGISTRY,
)
DEAD_LETTERS = Counter(
    "sundial_dead_letters", "Executions that went DEAD (no attempts left).", ["tenant", "pool"], registry=REGISTRY
)
DEAD_LETTER_QUEUE_SIZE = Gauge(
    "sundial_dead_letter_queue_size",
    "DEAD executions (sampled from Postgres by the active sweeper only).",
    ["tenant"],
    registry=REGISTRY,
)
JOBS = Gauge(
    "sundial_jobs",
    "Jobs by state (sampled from Postgres by the active sweeper only).",
    ["tenant", "state"],
    registry=REGISTRY,
)
POOL_LIVE_WORKERS = Gauge(
    "sundial_pool_live_workers",
    "Workers announcing themselves in a pool (sampled from Redis by the active sweeper only).",
    ["pool"],
    registry=REGISTRY,
)
POOL_PENDING = Gauge(
    "sundial_pool_pending_executions",
    "Executions of a pool waiting for a worker (PENDING), every tenant's (sampled by the active sweeper only).",
    ["pool"],
    registry=REGISTRY,
)
POOL_UNSERVED = Gauge(
    "sundial_pool_unserved",
    "1 while a pool has work and no live worker (sundial_common.coordination.pool_service), else 0 (active sweeper "
    "only).",
    ["pool"],
    registry=REGISTRY,
)
MISSED_FIRES = Counter(
    "sundial_missed_fires",
    "Occurrences missed beyond their catch-up window without a run.",
    ["tenant"],
    registry=REGISTRY,
)
BREAKER_STATE = Gauge(
    "sundial_breaker_state",
    "A handler's retry circuit breaker: 0 CLOSED, 1 HALF_OPEN, 2 OPEN (active sweeper only).",
    ["tenant", "pool", "handler"],
    registry=REGISTRY,
)
BREAKER_HELD = Gauge(
    "sundial_breaker_held_retries",
    "Scheduled retries a handler's circuit breaker holds (active sweeper only).",
    ["tenant", "pool", "handler"],
    registry=REGISTRY,
)
HOT_WINDOW_MEMBERS = Gauge(
    "sundial_hot_window_members",
    "Members of a shard's Redis hot window (active hydrator).",
    ["shard"],
    registry=REGISTRY,
)
HOT_WINDOW_OLDEST_DUE_AGE = Gauge(
    "sundial_hot_window_oldest_due_age_seconds",
    "How long the earliest member of a shard's hot window has been due; 0 when nothing is overdue.",
    ["shard"],
    registry=REGISTRY,
)
SHARD_LEADER = Gauge(
    "sundial_shard_leader",
    "1 while this dispatcher replica leads the shard, else 0.",
    ["shard", "replica"],
    registry=REGISTRY,
)
SHARD_FENCE_TOKEN = Gauge(
    "sundial_shard_fence_token",
    "The fencing token of the term this replica leads the shard with.",
    ["shard"],
    registry=REGISTRY,
)
DISPATCH_BATCH_SIZE = Histogram(
    "sundial_dispatch_batch_size",
    "Members claimed by a dispatch pass that claimed any.",
    ["shard"],
    buckets=BATCH_BUCKETS,
    registry=REGISTRY,
)
DISPATCH_PASS_DURATION = Histogram(
    "sundial_dispatch_pass_duration_seconds",
    "Wall time of one dispatch pass of a shard (empty passes included).",
    ["shard"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
CONSUMER_LAG = Gauge(
    "sundial_consumer_lag_messages",
    "Messages of a pool's partition not yet taken by this worker (high watermark minus position).",
    ["pool", "partition"],
    registry=REGISTRY,
)
SWEEPER_RECOVERIES = Counter(
    "sundial_sweeper_recoveries",
    "What the sweeper recovered: attempts of lost workers (worker_lost), attempts past their timeout "
    "(timed_out), PENDING executions sent again (republished).",
    ["reason"],
    registry=REGISTRY,
)
API_REQUESTS = Counter(
    "sundial_api_requests", "HTTP requests answered by the API.", ["route", "method", "status"], registry=REGISTRY
)
API_REQUEST_DURATION = Histogram(
    "sundial_api_request_duration_seconds",
    "Time the API took to answer a request.",
    ["route", "method", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
JOBS_CREATED = Counter(
    "sundial_jobs_created", "Jobs registered through the API.", ["tenant", "type"], registry=REGISTRY
)
POOL_REFUSALS = Counter(
    "sundial_pool_refusals",
    "Work refused for its pool: by the API (where=api; reason unregistered, forbidden, not_staging: a replay's "
    "target that is not a staging pool, or staging: a job's pool that is one) or by a "
    "worker whose pool does not admit the message's tenant (where=worker, reason=forbidden). Tenant and pool are "
    "in the log line of each refusal, not in labels (a request can name any pool).",
    ["where", "reason"],
    registry=REGISTRY,
)

BULK_ITEMS = Counter(
    "sundial_bulk_items",
    "Rows a bulk operation's runner took its turn on (active replayer only), by what the operation acts on "
    "(executions, jobs), its action and the outcome: DONE, SKIPPED (no longer matching), FAILED.",
    ["target", "action", "outcome"],
    registry=REGISTRY,
)
BULK_OPERATIONS_ACTIVE = Gauge(
    "sundial_bulk_operations_active",
    "Bulk operations not finished (PREPARING or RUNNING), as the active replayer saw them at its last pass.",
    registry=REGISTRY,
)

M = TypeVar("M", bound=MetricWrapperBase)


class Children(Generic[M]):
    """The label children of one metric, each bound once: ``children(tenant, pool)`` is a dict lookup.

    prometheus-client's ``labels()`` validates and locks on every call; a loop that records per execution
    calls this instead. The cache grows with the label values seen, which are bounded (see above).
    """

    __slots__ = ("_children", "_metric")

    def __init__(self, metric: M) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child

    def forget(self, keep: Iterable[tuple[str, ...]] = ()) -> None:
        """Remove the series not in ``keep`` (a sampled gauge whose label values went away, a lost role)."""
        kept = set(keep)
        for values in [v for v in self._children if v not in kept]:
            del self._children[values]
            try:
                self._metric.remove(*values)
            except KeyError:
                pass


class AttemptsEnded:
    """Counts ended attempts — retried, finished (by final state), dead — the same way wherever they end.

    The worker's outcome flusher and the sweeper each hold one and hand it every batch Postgres accepted:
    each batch costs one increment per distinct (tenant, pool, what) in it.
    """

    def __init__(self) -> None:
        self._finished: Children[Counter] = Children(EXECUTIONS_FINISHED)
        self._retries: Children[Counter] = Children(RETRIES)
        self._dead: Children[Counter] = Children(DEAD_LETTERS)

    def record(self, ended: Iterable[tuple[str, str, str, bool]]) -> None:
        """``ended``: (tenant, pool, the execution's state now, a retry was scheduled) per accepted attempt."""
        counts: dict[tuple[str, str, str, bool], int] = {}
        for key in ended:
            counts[key] = counts.get(key, 0) + 1
        for (tenant, pool, state, retried), n in counts.items():
            if retried:
                self._retries(tenant, pool).inc(n)
                continue
            self._finished(tenant, pool, state).inc(n)
            if state == "DEAD":
                self._dead(tenant, pool).inc(n)


def describe_process(service: str, instance: str) -> None:
    """Name this process in ``sundial_process_info`` (called once, by the process setup)."""
    PROCESS.info({"service": service, "instance": instance})


def exposition(accept: str | None = None) -> tuple[bytes, str]:
    """The registry and its content type for a scraper whose ``Accept`` header is ``accept``.

    OpenMetrics text when the scraper asks for ``application/openmetrics-text`` (Prometheus does, and only
    that format carries exemplars: the trace id of a slow dispatch), Prometheus' text format otherwise.
    """
    encoder, content_type = choose_encoder(accept or "")
    return encoder(REGISTRY), content_type
