"""The handler's span on the real stack: it continues the dispatch trace, and without an exporter no span is
built while the handler still runs in that trace.
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import propagate
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from sundial_common.broker.kafka import KafkaPublisher
from sundial_common.observability.tracing import trace_id_hex, traceparent, tracer
from sundial_common.stores import Stores
from sundial_worker import Context, Worker
from sundial_worker.settings import WorkerSettings

from tests.support.worker import TENANT, dispatch, pool, publish, serving, settings, wait_state

__all__ = ["pool", "settings"]  # the fixtures


async def test_handler_span_continues_the_dispatch_trace(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str, spans: InMemorySpanExporter
) -> None:
    with tracer.start_as_current_span("dispatch", kind=SpanKind.PRODUCER) as dispatch_span:
        carrier = traceparent()
    assert carrier is not None
    worker = Worker(pool=pool)

    outgoing: dict[str, str] = {}

    @worker.handler("traced")
    async def traced(ctx: Context, payload: Any) -> str | None:
        # The handler's own work, as docs/operations/observability.md shows it: a span of its own and an outgoing call.
        with tracer.start_as_current_span("charge card"):
            propagate.inject(outgoing)
        return ctx.trace_id

    async with serving(worker, settings):
        [message] = await dispatch(stores, pool, "traced", [{}], traceparent_value=carrier)
        await publish(publisher, [message])
        row = await wait_state(stores, message, "SUCCEEDED")
    mine = [
        s
        for s in spans.get_finished_spans()
        if s.attributes and s.attributes.get("sundial.execution_id") == message.execution_id
    ]
    [process] = [s for s in mine if s.name == f"process {message.topic}"]
    [handler] = [s for s in mine if s.name == "traced"]
    [write] = [s for s in mine if s.name == "record outcome"]
    assert process.kind == SpanKind.CONSUMER
    assert process.parent is not None
    assert process.parent.span_id == dispatch_span.get_span_context().span_id
    assert {s.context.trace_id for s in mine} == {dispatch_span.get_span_context().trace_id}
    assert process.attributes is not None
    assert process.attributes["messaging.system"] == "kafka"
    assert process.attributes["messaging.destination.name"] == message.topic
    assert process.attributes["messaging.kafka.message.key"] == message.execution_id
    assert process.attributes["sundial.attempt"] == 1 and process.attributes["sundial.tenant"] == TENANT
    assert process.attributes["sundial.outcome"] == "SUCCEEDED"
    # The handler span is the process span's child, and the outcome write hangs under the process span too.
    assert handler.parent is not None and handler.parent.span_id == process.context.span_id
    assert handler.attributes is not None and handler.attributes["sundial.handler"] == "traced"
    assert write.parent is not None and write.parent.span_id == process.context.span_id
    [own] = [s for s in spans.get_finished_spans() if s.name == "charge card"]
    assert own.parent is not None and own.parent.span_id == handler.context.span_id
    assert outgoing["traceparent"].split("-")[1:3] == [row["trace_id"], format(own.context.span_id, "016x")]
    assert row["result"] == trace_id_hex(dispatch_span) == row["trace_id"]


async def test_without_an_exporter_no_span_is_built_and_the_handler_still_runs_in_the_dispatch_trace(
    stores: Stores,
    publisher: KafkaPublisher,
    settings: WorkerSettings,
    pool: str,
    spans: InMemorySpanExporter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What a worker without SUNDIAL_OTLP_ENDPOINT does (ALWAYS_OFF: nothing could be recorded), here under the test
    # session's recording provider.
    monkeypatch.setattr("sundial_worker.execution.spans_recorded", lambda: False)
    with tracer.start_as_current_span("dispatch", kind=SpanKind.PRODUCER) as dispatch_span:
        carrier = traceparent()
    assert carrier is not None
    worker = Worker(pool=pool)
    outgoing: dict[str, str] = {}

    @worker.handler("traced")
    async def traced(ctx: Context, payload: Any) -> str | None:
        propagate.inject(outgoing)  # an instrumented outgoing call
        return ctx.trace_id

    async with serving(worker, settings):
        [message] = await dispatch(stores, pool, "traced", [{}], traceparent_value=carrier)
        await publish(publisher, [message])
        row = await wait_state(stores, message, "SUCCEEDED")
    assert not [
        s
        for s in spans.get_finished_spans()
        if s.attributes and s.attributes.get("sundial.execution_id") == message.execution_id
    ]
    assert row["result"] == trace_id_hex(dispatch_span) == row["trace_id"]
    # The call carries the execution's trace, unsampled, as the ALWAYS_OFF tracer's span did.
    assert outgoing["traceparent"].split("-")[1] == row["trace_id"]
    assert int(outgoing["traceparent"][-2:], 16) & 0x01 == 0  # the sampled flag is clear
