"""The one place a Sundial process sets up its tracing and its metrics, and flushes them on the way out.

Every ``sundial <command>`` wraps its life in :func:`observed`::

    with observed("sundial-sweeper", settings):
        return run(serve)

which installs the tracer provider (:func:`sundial_common.observability.tracing.setup_tracing`: OTLP export when
``SUNDIAL_OTLP_ENDPOINT`` is set; otherwise spans are not recorded but still carry real trace ids), names
the process in ``sundial_process_info``, serves ``/metrics`` and the ``/healthz`` and ``/readyz`` probes on
``SUNDIAL_METRICS_PORT`` when it is set (:func:`sundial_common.observability.probes.serve_probes`), and at
the end flushes the spans still queued for export.
The API passes ``metrics=False``: it serves ``/metrics`` on its own HTTP port.

What a process records goes through :mod:`sundial_common.observability.metrics` (the registry, loop pass metrics) and
:mod:`sundial_common.observability.tracing` (the tracer); a loop driven by
:func:`sundial_common.runtime.service.every` is
measured and traced per pass without code of its own.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from sundial_common.observability.metrics import describe_process
from sundial_common.observability.probes import serve_probes, version
from sundial_common.observability.tracing import setup_tracing
from sundial_common.runtime.settings import CommonSettings

log = logging.getLogger(__name__)


def announce(service: str, instance: str) -> None:
    """Log which release this process runs, as it starts."""
    log.info("%s %s starting (instance %s)", service, version(), instance)


@contextlib.contextmanager
def observed(service: str, settings: CommonSettings, *, metrics: bool = True) -> Iterator[None]:
    """Tracing and metrics for the process ``service`` (``sundial-<command>``) while the block runs."""
    setup_tracing(service, settings.otlp_endpoint, settings.trace_sample_ratio, settings.instance_id)
    describe_process(service, settings.instance_id)
    announce(service, settings.instance_id)
    with contextlib.ExitStack() as stack:
        if metrics and settings.metrics_port is not None:
            stack.enter_context(serve_probes(settings.metrics_port, settings.metrics_host))
        try:
            yield
        finally:
            provider = trace.get_tracer_provider()
            if isinstance(provider, TracerProvider):
                provider.shutdown()  # flush spans still queued for export
