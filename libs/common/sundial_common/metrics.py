"""Prometheus metrics: the one registry every Sundial process records into, and how it is served.

Three things live here and nowhere else:

- :data:`REGISTRY`, the process's metrics registry. It is prometheus-client's default registry, so it
  already carries the process collector (``process_cpu_seconds_total``, ``process_resident_memory_bytes``,
  open file descriptors, start time) and the Python ones (``python_gc_*``, ``python_info``). A module that
  adds a metric declares it at import time with ``registry=REGISTRY`` and a name starting with ``sundial_``
  (Prometheus naming: base units in the name, ``_total`` for counters; never an execution or job id as a
  label).
- :class:`LoopMetrics`, how a background loop reports its passes. :func:`sundial_common.service.every` uses
  it for every named loop, so a loop built the usual way (a frozen config, ``run_once()`` returning counts,
  driven by ``every``) is measured without a line of its own: ``sundial_loop_passes_total{loop}``,
  ``sundial_loop_pass_errors_total{loop}``, ``sundial_loop_pass_duration_seconds{loop}`` and, for each count
  field of the result ``run_once()`` returned, ``sundial_loop_items_total{loop,item}`` (a sweeper pass that
  republished 3 executions adds 3 to ``{loop="sweep",item="republished"}``). A loop that is not driven by
  ``every`` calls :meth:`LoopMetrics.passed` / :meth:`LoopMetrics.failed` itself.
- :func:`serve_metrics`, the ``/metrics`` endpoint of a process without an HTTP server of its own
  (dispatcher, hydrator, sweeper, worker: on ``SUNDIAL_METRICS_PORT`` when set; see
  :mod:`sundial_common.observability`). The API serves :func:`exposition` on its own port instead.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Final

import prometheus_client
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, Info, generate_latest

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


def describe_process(service: str, instance: str) -> None:
    """Name this process in ``sundial_process_info`` (called once, by the process setup)."""
    PROCESS.info({"service": service, "instance": instance})


def exposition() -> tuple[bytes, str]:
    """The registry in Prometheus' text format, and its content type (for a process's own HTTP server)."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


@contextmanager
def serve_metrics(port: int, host: str = "127.0.0.1") -> Iterator[int]:
    """Serve ``GET /metrics`` from :data:`REGISTRY` on ``host:port`` while the block runs; yields the bound port.

    prometheus-client's own server, in a daemon thread: a scrape is answered even while the event loop is
    busy, and a process needs no HTTP framework for it. ``port`` 0 picks a free port (tests).
    """
    server, thread = prometheus_client.start_http_server(port, addr=host, registry=REGISTRY)
    bound = int(server.server_address[1])
    log.info("serving metrics on http://%s:%d/metrics", host, bound)
    try:
        yield bound
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
