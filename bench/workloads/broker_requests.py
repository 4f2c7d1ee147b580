"""Which requests the broker (Tansu) serves, by type: a small OTLP/HTTP metrics receiver for Tansu's own counters.

Tansu exports ``tansu_api_requests{api_key}`` (and bytes sent and received) over OTLP when it is started with
``OTEL_EXPORTER_OTLP_ENDPOINT`` in its environment; the bench's stack passes its environment on. So::

    uv run --frozen python -m bench broker-requests --port 24701 &
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:24701 OTEL_METRIC_EXPORT_INTERVAL=5000 \\
        uv run --frozen python -m bench w2
    uv run --frozen python -m bench broker-requests --summarize .sundial/bench/broker-requests.jsonl

records one line per export (the cumulative counters) and then prints the requests per second of each type
between consecutive exports. Tansu's counters carry no client id, but the request types say who asks: Produce
is the dispatchers' (and the sweeper's republishes), Fetch, OffsetCommit, Heartbeat and ListOffsets the workers'.
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

from bench.results import SCRATCH

#: Kafka API keys (the ones a Sundial stack sends).
API_KEYS = {
    0: "Produce",
    1: "Fetch",
    2: "ListOffsets",
    3: "Metadata",
    8: "OffsetCommit",
    9: "OffsetFetch",
    10: "FindCoordinator",
    11: "JoinGroup",
    12: "Heartbeat",
    13: "LeaveGroup",
    14: "SyncGroup",
    18: "ApiVersions",
    19: "CreateTopics",
    22: "InitProducerId",
    32: "DescribeConfigs",
    71: "GetTelemetrySubscriptions",
    72: "PushTelemetry",
}


def counters_of(body: bytes) -> dict[str, float]:
    """The broker's cumulative counters in one OTLP metrics export: requests by type, bytes received and sent."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    request = ExportMetricsServiceRequest()
    request.ParseFromString(body)
    counters: dict[str, float] = {}
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if not metric.HasField("sum"):
                    continue
                for point in metric.sum.data_points:
                    value = point.as_int or point.as_double
                    if metric.name == "tansu_api_requests":
                        attributes = {a.key: a.value.int_value for a in point.attributes}
                        key = attributes.get("api_key", -1)
                        name = API_KEYS.get(key, f"api_key {key}")
                        counters[name] = counters.get(name, 0) + value
                    elif metric.name in ("tansu_bytes_received", "tansu_bytes_sent"):
                        counters[metric.name.removeprefix("tansu_")] = value
    return counters


def serve(port: int, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as sink:

        class Receiver(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                sink.write(json.dumps({"t": time.time(), "counters": counters_of(body)}) + "\n")
                sink.flush()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        HTTPServer(("127.0.0.1", port), Receiver).serve_forever()


def summarize(path: Path) -> None:
    """Requests per second of each type between consecutive exports."""
    previous: dict[str, Any] | None = None
    for line in path.read_text().splitlines():
        current = json.loads(line)
        if previous is not None:
            seconds = current["t"] - previous["t"]
            rates = {
                name: round((value - previous["counters"].get(name, 0)) / seconds, 1)
                for name, value in sorted(current["counters"].items())
                if value != previous["counters"].get(name, 0)
            }
            print(f"{datetime.fromtimestamp(current['t'], UTC):%H:%M:%S}", json.dumps(rates))
        previous = current


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench broker-requests",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=24701, help="where Tansu's OTLP exporter sends (below 32768)")
    parser.add_argument("--out", type=Path, default=SCRATCH / "broker-requests.jsonl", help="scratch, outside git")
    parser.add_argument("--summarize", type=Path, help="print the per-second rates of a recorded file and exit")
    args = parser.parse_args(argv)
    if args.summarize:
        summarize(args.summarize)
    else:
        serve(args.port, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
