"""The gateway's metrics and spans: what its callers asked of it and what it answered, per pool.

Metrics (served on ``SUNDIAL_METRICS_PORT``, never on the gateway's own port: callers hold tenant credentials):

- ``sundial_gateway_pulls_total{pool,outcome}`` — pulls answered, with work (``work``) or without (``empty``);
- ``sundial_gateway_executions_leased_total{pool}`` — executions started for a caller and handed out;
- ``sundial_gateway_pull_wait_seconds{pool}`` — how long a pull was held before its answer;
- ``sundial_gateway_open_polls{pool}`` — pulls being held now (open long polls);
- ``sundial_gateway_heartbeats_total{pool,answer}`` — attempts heartbeated: ``renewed``, ``cancel`` (renewed, asked
  to stop) or ``stale`` (not renewed: ended, another worker's, or a stale attempt token);
- ``sundial_gateway_finishes_total{pool,answer}`` — outcomes ``accepted`` or ``rejected``.

Spans: one SERVER span per call (``POST /v1/worker/pull`` …) with the pool, tenant and counts. A pull also opens, per
execution it hands out, a CONSUMER span ``process <topic>`` in the execution's own trace (its parent the message's
traceparent, as the direct worker's) linked both ways with the call's span; the lease carries that span's
traceparent, so the caller's handler continues the execution's trace. When nothing records spans (no OTLP endpoint)
no span is built: the traceparent is a non-recording child in the same trace.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from confluent_kafka import Message
from opentelemetry.trace import Link, Span, SpanKind
from prometheus_client import Counter, Gauge, Histogram
from sundial_common.broker.messages import ExecutionMessage
from sundial_common.observability.metrics import REGISTRY, Children
from sundial_common.observability.tracing import (
    execution_attributes,
    execution_context,
    spans_recorded,
    traceparent,
    tracer,
    unrecorded_traceparent,
)
from sundial_common.security.pool_tokens import PoolGrant

PULLS = Counter(
    "sundial_gateway_pulls",
    "Pulls the gateway answered, by pool and whether they handed out work (outcome: work, empty).",
    ["pool", "outcome"],
    registry=REGISTRY,
)
LEASED = Counter(
    "sundial_gateway_executions_leased",
    "Executions the gateway started for a caller and handed out in a pull's answer.",
    ["pool"],
    registry=REGISTRY,
)
PULL_WAIT = Histogram(
    "sundial_gateway_pull_wait_seconds",
    "How long the gateway held a pull before answering it (the long poll's wait, then the start).",
    ["pool"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0),
    registry=REGISTRY,
)
OPEN_POLLS = Gauge(
    "sundial_gateway_open_polls",
    "Pulls the gateway is holding now (open long polls), by pool.",
    ["pool"],
    registry=REGISTRY,
)
HEARTBEATS = Counter(
    "sundial_gateway_heartbeats",
    "Running attempts heartbeated through the gateway, by answer: renewed, cancel (renewed and asked to stop), "
    "stale (not renewed: finished, given to another worker, or a stale attempt token).",
    ["pool", "answer"],
    registry=REGISTRY,
)
FINISHES = Counter(
    "sundial_gateway_finishes",
    "Outcomes finished through the gateway, by answer: accepted (by the compare-and-swap, or repeated as first "
    "recorded), rejected (stale or foreign attempt, or the execution changed first).",
    ["pool", "answer"],
    registry=REGISTRY,
)

_pulls: Children[Counter] = Children(PULLS)
_leased: Children[Counter] = Children(LEASED)
_wait: Children[Histogram] = Children(PULL_WAIT)
_open: Children[Gauge] = Children(OPEN_POLLS)
_heartbeats: Children[Counter] = Children(HEARTBEATS)
_finishes: Children[Counter] = Children(FINISHES)


@contextmanager
def polling(pool: str) -> Iterator[None]:
    """Count a pull as an open long poll while the block runs."""
    gauge = _open(pool)
    gauge.inc()
    try:
        yield
    finally:
        gauge.dec()


def pulled(pool: str, leased: int, waited_sec: float) -> None:
    _pulls(pool, "work" if leased else "empty").inc()
    if leased:
        _leased(pool).inc(leased)
    _wait(pool).observe(waited_sec)


def heartbeated(pool: str, answers: Sequence[dict[str, Any]]) -> None:
    counts = {"renewed": 0, "cancel": 0, "stale": 0}
    for answer in answers:
        counts["cancel" if answer["cancel"] else "renewed" if answer["renewed"] else "stale"] += 1
    for kind, n in counts.items():
        if n:
            _heartbeats(pool, kind).inc(n)


def finished(pool: str, answers: Sequence[dict[str, Any]]) -> None:
    accepted = sum(1 for answer in answers if answer["accepted"])
    if accepted:
        _finishes(pool, "accepted").inc(accepted)
    if len(answers) > accepted:
        _finishes(pool, "rejected").inc(len(answers) - accepted)


@contextmanager
def request_span(route: str, grant: PoolGrant) -> Iterator[Span]:
    """The SERVER span of one call of ``route`` by ``grant``'s caller."""
    with tracer.start_as_current_span(
        f"POST {route}",
        kind=SpanKind.SERVER,
        attributes={
            "http.request.method": "POST",
            "http.route": route,
            "sundial.pool": grant.pool,
            "sundial.tenant": grant.tenant,
            "sundial.pool_token_id": grant.token_id,
        },
    ) as span:
        yield span


def message_traceparent(message: ExecutionMessage, delivery: Message) -> str | None:
    """The execution's traceparent as its message carries it: the Kafka header (this attempt's send span), else the
    message's own."""
    headers = delivery.headers()
    # Consumed messages carry a list of (name, value) pairs; the dict form only exists for producing.
    pairs = headers.items() if isinstance(headers, dict) else headers or ()
    for name, value in pairs:
        if name == "traceparent" and value:
            return value.decode() if isinstance(value, bytes) else str(value)
    return message.traceparent


def lease_traceparent(
    request: Span | None, topic: str, worker: str, row: Mapping[str, Any], message: ExecutionMessage, parent: str | None
) -> str | None:
    """The traceparent a lease hands out: of a CONSUMER span in the execution's trace (recorded only where spans
    are), linked with the pull's span ``request``."""
    if not spans_recorded():
        return unrecorded_traceparent(parent)
    links = [Link(request.get_span_context())] if request is not None else []
    span = tracer.start_span(
        f"process {topic}",
        context=execution_context(parent),
        kind=SpanKind.CONSUMER,
        links=links,
        attributes={
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": topic,
            **execution_attributes(
                tenant=row["tenant_id"],
                job_id=row["job_id"],
                execution_id=row["id"],
                attempt=row["attempt"],
                pool=message.pool,
                handler=message.handler,
            ),
            "sundial.worker_id": worker,
            "sundial.gateway": True,
        },
    )
    span.end()
    if request is not None:
        request.add_link(span.get_span_context())
    return traceparent(span)
