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
import re
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import INVALID_SPAN_CONTEXT, Link, NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

log = logging.getLogger(__name__)
_propagator = TraceContextTextMapPropagator()

tracer = trace.get_tracer("sundial")

_ids = RandomIdGenerator()
#: A W3C traceparent the propagator accepts (version 00 or a later one, not ff; ids not all zeros).
_TRACEPARENT = re.compile(r"^[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:(-.*)|[ \t]*)$")


#: On a span about a failed, timed-out, worker-lost or dead attempt (or its dead letter): exported whatever
#: the sample ratio, so a failure is never sampled away (see :class:`KeepFailures`).
FAILURE = "sundial.failure"


class KeepFailures(Sampler):
    """Parent-based ratio sampling, except that a span marked :data:`FAILURE` at its start is always kept.

    Head sampling decides when a trace starts, long before anyone knows whether its execution will fail.
    Spans that report a failure (the outcome write of a FAILED or TIMED_OUT attempt, the sweeper's
    worker-lost or timeout verdict, the dead-letter publish) carry ``sundial.failure`` from their start and
    are sampled even inside an unsampled trace: Jaeger then shows the failure, its error and the
    execution's ``sundial.*`` tags under the execution's trace id (the unsampled ancestors are missing).
    A tail-sampling collector (docker-compose.yml) keeps the whole trace of a failure instead.
    """

    def __init__(self, ratio: float) -> None:
        self._ratio = ratio
        self._delegate = ParentBased(TraceIdRatioBased(ratio))

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        if attributes and attributes.get(FAILURE):
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, trace_state)
        return self._delegate.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        return f"KeepFailures(ParentBased(TraceIdRatioBased({self._ratio})))"


def setup_tracing(
    service: str, otlp_endpoint: str | None, sample_ratio: float = 1.0, instance_id: str | None = None
) -> None:
    """Install the process-wide tracer provider (once; later calls keep the first provider)."""
    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return
    sampler = KeepFailures(sample_ratio) if otlp_endpoint else ALWAYS_OFF
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


def _parent_trace(parent: str | None) -> tuple[str | None, int]:
    """The trace id (32 lowercase hex digits) and sampled flag a child of the traceparent ``parent`` inherits, as the
    SDK's W3C propagator reads it: (None, the random-trace-id flag) for a new trace when ``parent`` is missing or
    malformed."""
    if parent and len(parent) <= 512 and (match := _TRACEPARENT.match(parent)):
        version, trace_hex, span_hex, parent_flags, rest = match.groups()
        if trace_hex != "0" * 32 and span_hex != "0" * 16 and version != "ff" and not (version == "00" and rest):
            return trace_hex, int(parent_flags, 16) & TraceFlags.RANDOM_TRACE_ID
    return None, TraceFlags.RANDOM_TRACE_ID  # a new trace's id is random (W3C level 2), as the SDK says


def unrecorded_span(parent: str | None) -> Span:
    """A span that records nothing, in the trace of the traceparent ``parent`` (a new trace if it has none or it is
    malformed): what the SDK's tracer returns when its sampler drops every span, without its sampler, context
    and attribute work, which was half of the dispatch planner's time per execution (a microbenchmark of the
    planner: 66 µs per execution, 30 of them in the span)."""
    trace_hex, flags = _parent_trace(parent)
    trace_id = int(trace_hex, 16) if trace_hex is not None else _ids.generate_trace_id()
    context = SpanContext(trace_id, _ids.generate_span_id(), is_remote=False, trace_flags=TraceFlags(flags))
    return NonRecordingSpan(context)


def unrecorded_traceparent(parent: str | None) -> str:
    """``traceparent(unrecorded_span(parent))`` without the span: where nothing records spans (no exporter:
    :func:`spans_recorded` is false), all a new execution needs of its first span is its traceparent, and the
    span object, its context and the formatting back from integers were ~3 µs of the dispatch planner's ~23 µs
    per execution."""
    trace_hex, flags = _parent_trace(parent)
    if trace_hex is None:
        trace_hex = f"{_ids.generate_trace_id():032x}"
    return f"00-{trace_hex}-{_ids.generate_span_id():016x}-{flags:02x}"


def traceparent(span: Span | None = None) -> str | None:
    """The W3C traceparent of ``span`` (default: the current span), or None if there is none."""
    if span is not None:  # formatted as the propagator does, without its context round trip
        ids = span.get_span_context()
        if ids == INVALID_SPAN_CONTEXT or not ids.is_valid:
            return None
        return f"00-{ids.trace_id:032x}-{ids.span_id:016x}-{ids.trace_flags:02x}"
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
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


def spans_recorded() -> bool:
    """Whether this process may record any span: an SDK provider whose sampler is not ``ALWAYS_OFF``.

    Without an OTLP endpoint :func:`setup_tracing` installs ``ALWAYS_OFF``: every span is then a non-recording
    one that only carries its parent's trace id, and a hot path (the dispatch planner and the worker, per
    execution) may skip building spans — their attribute dicts, the sampler call, the context managers: a third
    of a worker's CPU per execution in py-spy — and use :func:`unrecorded_span` instead.
    """
    provider = trace.get_tracer_provider()
    return isinstance(provider, TracerProvider) and provider.sampler is not ALWAYS_OFF


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


def execution_send_span(row: Mapping[str, Any], topic: str, extra: Mapping[str, Any]) -> Span:
    """A PRODUCER span, in the execution's own trace, for a message sent about the execution ``row`` to ``topic``."""
    return tracer.start_span(
        f"send {topic}",
        context=execution_context(row["traceparent"]),
        kind=SpanKind.PRODUCER,
        attributes={
            **execution_attributes(
                tenant=row["tenant_id"],
                job_id=row["job_id"],
                execution_id=row["id"],
                attempt=row["attempt"],
                pool=row["pool"],
                handler=row["handler"],
            ),
            **kafka_publish_attributes(topic, str(row["id"])),
            **extra,
        },
    )


def trace_id_hex(span: Span) -> str:
    return format(span.get_span_context().trace_id, "032x")
