"""OpenTelemetry tracing: one trace per execution, API request → dispatch → Kafka → handler.

The link between processes is the W3C ``traceparent``: stored on the job by the API, on the
execution by the dispatcher, and carried as a Kafka header to the worker. Export is OTLP/HTTP when
``SUNDIAL_OTLP_ENDPOINT`` is set (Jaeger speaks OTLP), for ``SUNDIAL_TRACE_SAMPLE_RATIO`` of the traces.
Without an endpoint nothing is recorded: spans still carry trace ids and the traceparent still travels,
so every execution has its trace id, but a recorded span nobody exports was a fifth of a worker's CPU.
"""

from __future__ import annotations

import logging

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger(__name__)
_propagator = TraceContextTextMapPropagator()

tracer = trace.get_tracer("sundial")


def setup_tracing(service: str, otlp_endpoint: str | None, sample_ratio: float = 1.0) -> None:
    """Install the process-wide tracer provider (once; later calls keep the first provider)."""
    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return
    sampler = ParentBased(TraceIdRatioBased(sample_ratio)) if otlp_endpoint else ALWAYS_OFF
    provider = TracerProvider(resource=Resource.create({"service.name": service}), sampler=sampler)
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter: SpanExporter = OTLPSpanExporter(endpoint=otlp_endpoint)
        provider.add_span_processor(BatchSpanProcessor(exporter))
        log.info("exporting traces over OTLP to %s", otlp_endpoint)
    trace.set_tracer_provider(provider)


def traceparent(span: Span | None = None) -> str | None:
    """The W3C traceparent of ``span`` (default: the current span), or None if there is none."""
    carrier: dict[str, str] = {}
    context = trace.set_span_in_context(span) if span is not None else None
    _propagator.inject(carrier, context=context)
    return carrier.get("traceparent")


def context_from(traceparent_value: str | None) -> Context | None:
    """A parent context from a stored or received traceparent (None → start a new trace)."""
    if not traceparent_value:
        return None
    return _propagator.extract({"traceparent": traceparent_value})


def trace_id_hex(span: Span) -> str:
    return format(span.get_span_context().trace_id, "032x")
