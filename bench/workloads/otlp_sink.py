"""An OTLP/HTTP trace sink for measuring the cost of exporting: ``python -m bench otlp-sink --port N``.

It accepts what Sundial's exporters send (``POST /v1/traces``, an ExportTraceServiceRequest protobuf),
counts requests and spans, answers 200 and keeps nothing, so a benchmark pays for exporting without a
trace store on the same machine. On SIGTERM/SIGINT it prints one JSON line with the counts.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

REPLY = ExportTraceServiceResponse().SerializeToString()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench otlp-sink", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    counts = {"requests": 0, "spans": 0, "bytes": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = ExportTraceServiceRequest.FromString(body)
            spans = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
            with lock:
                counts["requests"] += 1
                counts["spans"] += spans
                counts["bytes"] += len(body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(REPLY)))
            self.end_headers()
            self.wfile.write(REPLY)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.serve_forever()
    print(json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
