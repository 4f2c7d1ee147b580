"""A real OTLP/HTTP trace receiver for tests: what Jaeger's OTLP endpoint receives, decoded and kept.

Jaeger's binaries are not installable on the test machines, so the tests run this instead: an HTTP server
that accepts ``POST /v1/traces`` with an ``ExportTraceServiceRequest`` protobuf (opentelemetry-proto, the
exporter's own wire format) and keeps every span with its resource, parent, kind, status, attributes,
events and links. :meth:`OtlpReceiver.trace` and :func:`tree_problems` answer what a person looking at
Jaeger would see: one trace, its root, orphans.

It listens on ``OTLP_TEST_PORT`` + ``SUNDIAL_TEST_PORT_OFFSET`` (13318…14818, outside every other test
and bench port range), so concurrent sessions with different offsets never collide.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

OTLP_TEST_PORT = 13318
KINDS = {
    Span.SPAN_KIND_INTERNAL: "INTERNAL",
    Span.SPAN_KIND_SERVER: "SERVER",
    Span.SPAN_KIND_CLIENT: "CLIENT",
    Span.SPAN_KIND_PRODUCER: "PRODUCER",
    Span.SPAN_KIND_CONSUMER: "CONSUMER",
}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    instance: str | None
    name: str
    kind: str
    trace_id: str  # 32 hex digits, as Jaeger shows it
    span_id: str
    parent_span_id: str  # "" for a root
    error: bool
    attributes: dict[str, Any] = field(default_factory=dict)
    events: tuple[str, ...] = ()
    links: tuple[tuple[str, str], ...] = ()  # (trace id, span id)

    def __repr__(self) -> str:
        return f"<{self.service} {self.kind} {self.name!r} {self.span_id} ← {self.parent_span_id or 'root'}>"


class OtlpReceiver:
    """Accepts OTLP/HTTP protobuf trace exports on ``/v1/traces`` and keeps the spans."""

    def __init__(self, port: int | None = None) -> None:
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver._keep(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: object) -> None:
                pass

        if port is None:
            port = OTLP_TEST_PORT + int(os.environ.get("SUNDIAL_TEST_PORT_OFFSET", "0") or "0")
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)
        self.thread.start()

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        received: list[ReceivedSpan] = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            service=resource["service.name"],
                            instance=resource.get("service.instance.id"),
                            name=span.name,
                            kind=KINDS.get(span.kind, "UNSPECIFIED"),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            error=span.status.code == Status.STATUS_CODE_ERROR,
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            events=tuple(e.name for e in span.events),
                            links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
                        )
                    )
        with self._lock:
            self.spans += received

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def about(self, execution_id: str) -> list[ReceivedSpan]:
        """Every span tagged with this execution (Jaeger's tag search ``sundial.execution_id=…``)."""
        return [s for s in self.snapshot() if s.attributes.get("sundial.execution_id") == execution_id]

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.snapshot() if s.trace_id == trace_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def tree_problems(spans: Iterable[ReceivedSpan]) -> list[str]:
    """What would look broken in Jaeger: several traces, trace id 0, not exactly one root, orphan spans."""
    spans = list(spans)
    problems: list[str] = []
    traces = {s.trace_id for s in spans}
    if len(traces) != 1:
        problems.append(f"{len(traces)} traces")
    if "0" * 32 in traces:
        problems.append("trace id 0")
    ids = {s.span_id for s in spans}
    roots = [s for s in spans if not s.parent_span_id]
    if len(roots) != 1:
        problems.append(f"roots: {roots}")
    orphans = [s for s in spans if s.parent_span_id and s.parent_span_id not in ids]
    if orphans:
        problems.append(f"orphans: {orphans}")
    return problems


def otlp_env(receiver: OtlpReceiver) -> dict[str, str]:
    # OTEL_BSP_SCHEDULE_DELAY: export within moments, not the SDK's 5 s.
    return {"SUNDIAL_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"}
