"""The gateway's metrics and spans, in process against the real servers: a pull, a heartbeat and finishes (one
accepted, one rejected) move the per-pool counters an operator graphs; the pull's span is linked with a span in each
execution's own trace, whose traceparent the lease hands out."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from sundial_common.broker.kafka import KafkaPublisher
from sundial_common.observability.metrics import REGISTRY
from sundial_common.observability.tracing import traceparent, tracer
from sundial_common.stores import Stores

from tests.integration.test_gateway import TENANT, bearer, beat, gateway, pool_token, pull_all
from tests.support.pools import admit
from tests.support.worker import dispatch, publish

__all__ = ["gateway"]  # the fixture


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_pulls_heartbeats_and_finishes_are_counted_and_traced(
    gateway: tuple[httpx.AsyncClient, Any],
    stores: Stores,
    publisher: KafkaPublisher,
    database_url: str,
    spans: InMemorySpanExporter,
) -> None:
    http, _app = gateway
    pool = admit(database_url, f"gwt-{uuid.uuid4().hex[:8]}", TENANT)
    token = await pool_token(stores, pool)
    with tracer.start_as_current_span("dispatch", kind=SpanKind.PRODUCER) as dispatch_span:
        carrier = traceparent()
    messages = await dispatch(stores, pool, "echo", [{"n": 1}, {"n": 2}], tenant=TENANT, traceparent_value=carrier)
    await publish(publisher, messages)

    leased = await pull_all(http, token, "session-t", 2)
    assert sample("sundial_gateway_executions_leased_total", pool=pool) == 2
    assert sample("sundial_gateway_pulls_total", pool=pool, outcome="work") >= 1
    assert sample("sundial_gateway_pull_wait_seconds_count", pool=pool) >= 1
    assert sample("sundial_gateway_open_polls", pool=pool) == 0  # every pull answered

    # Each lease continues its execution's trace; the gateway's span there is linked with the pull's span.
    trace_hex = f"{dispatch_span.get_span_context().trace_id:032x}"
    assert all(lease["traceparent"].split("-")[1] == trace_hex for lease in leased), leased
    finished = spans.get_finished_spans()
    processes = [s for s in finished if s.name.startswith("process ") and attrs(s).get("sundial.pool") == pool]
    # A pull answers with what is there: the two may come in one pull or two.
    requests = [s for s in finished if s.name == "POST /v1/worker/pull" and attrs(s)["sundial.executions"]]
    assert len(processes) == 2 and all(s.kind == SpanKind.CONSUMER for s in processes)
    assert all(s.parent is not None and s.parent.span_id == dispatch_span.get_span_context().span_id for s in processes)
    assert {s.links[0].context.span_id for s in processes} <= {r.context.span_id for r in requests}
    assert {link.context.span_id for r in requests for link in r.links} == {s.context.span_id for s in processes}

    first, second = leased
    beats = await http.post(
        "/v1/worker/heartbeat", json={"session": "session-t", "running": [beat(first)]}, headers=bearer(token)
    )
    assert beats.json()["running"][0]["renewed"] is True
    assert sample("sundial_gateway_heartbeats_total", pool=pool, answer="renewed") == 1

    outcomes = [
        {**beat(first), "state": "SUCCEEDED", "result": 1},
        {**beat(second), "attemptToken": first["attemptToken"], "state": "SUCCEEDED"},  # not second's token
    ]
    answer = await http.post(
        "/v1/worker/finish", json={"session": "session-t", "outcomes": outcomes}, headers=bearer(token)
    )
    assert [o["accepted"] for o in answer.json()["outcomes"]] == [True, False]
    assert sample("sundial_gateway_finishes_total", pool=pool, answer="accepted") == 1
    assert sample("sundial_gateway_finishes_total", pool=pool, answer="rejected") == 1
    [finish_span] = [s for s in spans.get_finished_spans() if s.name == "POST /v1/worker/finish"]
    assert finish_span.kind == SpanKind.SERVER and attrs(finish_span)["sundial.pool"] == pool
