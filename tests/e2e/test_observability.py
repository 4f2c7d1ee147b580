"""Every process goes through the same observability setup: real hydrator and sweeper processes serve
``/metrics`` with their loop pass counts, and export spans with real trace ids to an OTLP/HTTP receiver.

The receiver is a small HTTP server of the test's own that decodes the exported protobuf
(opentelemetry-proto) — exactly what Jaeger's OTLP endpoint receives.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Processes, free_port


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: bytes


class OtlpReceiver:
    """Accepts OTLP/HTTP protobuf trace exports on ``/v1/traces`` and keeps the spans."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                for resource_spans in request.resource_spans:
                    attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            receiver.spans.append(ReceivedSpan(attributes["service.name"], span.name, span.trace_id))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    try:
        yield receiver
    finally:
        receiver.close()


def loop_passes(metrics_port: int, loop: str) -> tuple[float, set[str]]:
    """``sundial_loop_passes_total{loop}`` and the item labels counted for it, as scraped from the process."""
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).text
    passes, items = 0.0, set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("loop") != loop:
                continue
            if sample.name == "sundial_loop_passes_total":
                passes = sample.value
            elif sample.name == "sundial_loop_pass_duration_seconds_count":
                items.add("duration")
    return passes, items


@pytest.mark.e2e
@pytest.mark.parametrize(("command", "loop"), [("hydrator", "hydrate"), ("sweeper", "sweep")])
def test_a_loop_process_serves_its_pass_counts_and_exports_real_trace_ids(
    processes: Processes, otlp: OtlpReceiver, command: str, loop: str
) -> None:
    metrics_port = free_port()
    processes.start(
        command,
        command,
        "--interval",
        "0.2",
        env={
            "SUNDIAL_METRICS_PORT": str(metrics_port),
            "SUNDIAL_OTLP_ENDPOINT": otlp.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "200",  # export within moments, not the SDK's 5 s
            "SUNDIAL_INSTANCE_ID": f"{command}-observed",
        },
    )
    processes.wait_http_ok(command, f"http://127.0.0.1:{metrics_port}/metrics")

    deadline = time.monotonic() + 30
    passes, seen = 0.0, set[str]()
    while time.monotonic() < deadline and passes < 3:
        passes, seen = loop_passes(metrics_port, loop)
        time.sleep(0.1)
    assert passes >= 3, processes.log(command)[-3000:]
    assert "duration" in seen
    info = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).text
    assert f'sundial_process_info{{instance="{command}-observed",service="sundial-{command}"}} 1.0' in info

    service = f"sundial-{command}"
    while time.monotonic() < deadline and not any(s.service == service for s in otlp.spans):
        time.sleep(0.1)
    mine = [s for s in otlp.spans if s.service == service]
    assert mine, processes.log(command)[-3000:]
    assert {s.name for s in mine} == {f"{loop} pass"}
    assert all(s.trace_id != bytes(16) for s in mine)  # trace id 0 is what a process without the setup sends
    assert len({s.trace_id for s in mine}) == len(mine)  # one trace per pass
