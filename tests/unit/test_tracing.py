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


def test_an_unrecorded_span_is_what_an_always_off_tracer_gives_minus_the_fresh_span_id() -> None:
    """Without an OTLP endpoint the worker builds no spans (sundial_common.telemetry.unrecorded_span): a handler's
    calls still carry the execution's trace id, as unsampled, as the ALWAYS_OFF tracer's span did."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    from sundial_common.telemetry import unrecorded_span

    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    off = TracerProvider(sampler=ALWAYS_OFF).get_tracer("test")
    context = TraceContextTextMapPropagator().extract({"traceparent": parent})
    with off.start_as_current_span("process", context=context) as span:
        expected = span.get_span_context()
    got = unrecorded_span(parent).get_span_context()
    assert (got.trace_id, got.trace_flags, got.is_valid) == (expected.trace_id, expected.trace_flags, True)
    assert got.span_id == 0xB7AD6B7169203331
    # A later version's longer form goes through the propagator; none or garbage: no trace.
    assert unrecorded_span(parent.replace("00-", "01-", 1) + "-extra").get_span_context().trace_id == got.trace_id
    for bad in (None, "", "garbage", "00-" + "0" * 32 + "-b7ad6b7169203331-01", parent.upper()):
        assert not unrecorded_span(bad).get_span_context().is_valid
