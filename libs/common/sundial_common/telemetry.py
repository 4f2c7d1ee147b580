"""OpenTelemetry tracing: one trace per execution, API request → dispatch → Kafka → handler.

The link between processes is the W3C ``traceparent``: stored on the job by the API, on the
execution by the dispatcher, and carried as a Kafka header to the worker. Export is OTLP/HTTP when
``SUNDIAL_OTLP_ENDPOINT`` is set (Jaeger speaks OTLP), for ``SUNDIAL_TRACE_SAMPLE_RATIO`` of the traces.
Without an endpoint nothing is recorded: spans still carry trace ids and the traceparent still travels,
so every execution has its trace id, but a recorded span nobody exports was a fifth of a worker's CPU.

The execution row's ``traceparent`` (its first dispatch span) is the anchor of the execution's trace:
every later actor — a retry's dispatch, the worker's process span, the sweeper's recovery, the API's
cancel, the dead-letter publish — starts its span with :func:`execution_context` of that value, so Jaeger
shows one tree per execution. Loop passes (``service.every``) are traces of their own and never parents of
these spans: an execution span always gets an explicit parent context, and a root context when the row
has none.
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


def setup_tracing(
    service: str, otlp_endpoint: str | None, sample_ratio: float = 1.0, instance_id: str | None = None
) -> None:
    """Install the process-wide tracer provider (once; later calls keep the first provider)."""
    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return
    sampler = ParentBased(TraceIdRatioBased(sample_ratio)) if otlp_endpoint else ALWAYS_OFF
    attributes = {"service.name": service}
    if instance_id:
        attributes["service.instance.id"] = instance_id
    provider = TracerProvider(resource=Resource.create(attributes), sampler=sampler)
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


def execution_context(traceparent_value: str | None) -> Context:
    """The parent context for a span about an execution: its stored traceparent, else a new root.

    Never the current context: inside a loop pass that would hang the span under the pass's own trace.
    """
    return context_from(traceparent_value) or Context()


def execution_attributes(
    *,
    tenant: str,
    job_id: object,
    execution_id: object,
    attempt: int | None = None,
    pool: str | None = None,
    handler: str | None = None,
) -> dict[str, str | int]:
    """The ``sundial.*`` attributes every span about an execution carries (Jaeger's tag search finds them)."""
    attributes: dict[str, str | int] = {
        "sundial.tenant": tenant,
        "sundial.job_id": str(job_id),
        "sundial.execution_id": str(execution_id),
    }
    if attempt is not None:
        attributes["sundial.attempt"] = attempt
    if pool is not None:
        attributes["sundial.pool"] = pool
    if handler is not None:
        attributes["sundial.handler"] = handler
    return attributes


def kafka_publish_attributes(topic: str, key: str) -> dict[str, str | int]:
    """OpenTelemetry messaging semantic conventions of a Kafka PRODUCER span."""
    return {
        "messaging.system": "kafka",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": topic,
        "messaging.kafka.message.key": key,
    }


def trace_id_hex(span: Span) -> str:
    return format(span.get_span_context().trace_id, "032x")
