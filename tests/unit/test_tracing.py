"""Sampling never loses a failure: :class:`sundial_common.telemetry.KeepFailures` on a provider of its own."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sundial_common.telemetry import FAILURE, KeepFailures


def _provider(ratio: float) -> tuple[trace.Tracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=KeepFailures(ratio))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


def test_a_failure_is_exported_from_a_trace_the_ratio_dropped() -> None:
    tracer, exported = _provider(0.0)
    with tracer.start_as_current_span("send sundial.pool.demo") as send:
        assert not send.is_recording()
        with tracer.start_as_current_span("process sundial.pool.demo"):
            with tracer.start_as_current_span("handler"):
                pass
        tracer.start_span("record outcome", attributes={FAILURE: True, "sundial.execution_id": "e"}).end()
    [failure] = exported.get_finished_spans()
    assert failure.name == "record outcome"
    # In the execution's own trace: Jaeger finds it under the execution's traceId.
    assert failure.context.trace_id == send.get_span_context().trace_id
    assert failure.parent is not None and failure.parent.span_id == send.get_span_context().span_id


def test_ordinary_spans_follow_the_parent_based_ratio() -> None:
    tracer, exported = _provider(1.0)
    with tracer.start_as_current_span("send"), tracer.start_as_current_span("process"):
        pass
    assert [s.name for s in exported.get_finished_spans()] == ["process", "send"]
