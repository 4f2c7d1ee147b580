"""Sampling never loses a failure (:class:`sundial_common.observability.tracing.KeepFailures` on a provider of its
own), and a
process without an exporter gives its executions the trace ids the SDK would (``unrecorded_span``)."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from sundial_common.observability.tracing import (
    FAILURE,
    KeepFailures,
    context_from,
    traceparent,
    unrecorded_span,
    unrecorded_traceparent,
)

_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


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


def test_an_unrecorded_span_is_what_the_sdk_makes_without_an_exporter() -> None:
    sdk = TracerProvider(sampler=ALWAYS_OFF).get_tracer("test")
    valid = (_PARENT, _PARENT[:-2] + "03")
    for parent in (*valid, None, "", "garbage", "00-" + "0" * 32 + "-b7ad6b7169203331-01", _PARENT + "-extra"):
        ours = traceparent(unrecorded_span(parent))
        # The planner's shortcut (no span at all) gives the same traceparent, but for its fresh ids.
        alone = unrecorded_traceparent(parent)
        assert len(alone) == len(ours or "") and alone[-3:] == (ours or "")[-3:]
        assert (alone[3:35] == (ours or "")[3:35]) is (parent in valid)
        theirs = traceparent(sdk.start_span("send", context=context_from(parent) or Context()))
        assert ours is not None and theirs is not None
        # Same shape and flags, the parent's trace when it has a valid one, a fresh span id each time.
        assert ours[:3] == theirs[:3] == "00-" and ours[-3:] == theirs[-3:]
        assert (ours[3:35] == theirs[3:35]) is (parent in valid)
        assert ours[36:52] != theirs[36:52]
        assert not unrecorded_span(parent).is_recording()
    # Each root is a trace of its own.
    assert traceparent(unrecorded_span(None))[3:35] != traceparent(unrecorded_span(None))[3:35]  # type: ignore[index]
