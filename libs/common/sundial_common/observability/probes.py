"""The HTTP server of a process without one of its own: ``/metrics``, ``/healthz``, ``/readyz`` and ``/version``.

It runs in a daemon thread, so a scrape or a probe is answered even while the event loop is busy — and a
liveness probe can tell a busy event loop from a blocked one (:mod:`sundial_common.observability.health`).
``/healthz`` and ``/readyz`` answer 200 with ``ok`` or 503 with one reason a line; any other path is a 404,
so a probe pointed at the wrong path fails instead of passing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata

from sundial_common.observability.health import HEALTH
from sundial_common.observability.metrics import exposition

log = logging.getLogger(__name__)


def version() -> str:
    """The installed Sundial version (of the ``sundial-common`` distribution every process carries)."""
    try:
        return metadata.version("sundial-common")
    except metadata.PackageNotFoundError:
        return "unknown"


class _ProbeHandler(BaseHTTPRequestHandler):
    server_version = "sundial-probes"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            body, content_type = exposition(self.headers.get("Accept"))
            self._answer(200, body, content_type)
        elif path in ("/healthz", "/readyz"):
            problems = HEALTH.liveness() if path == "/healthz" else HEALTH.readiness()
            text = "\n".join(problems) if problems else "ok"
            self._answer(503 if problems else 200, (text + "\n").encode(), "text/plain; charset=utf-8")
        elif path == "/version":
            self._answer(200, (version() + "\n").encode(), "text/plain; charset=utf-8")
        else:
            self._answer(404, b"not found: try /metrics, /healthz, /readyz or /version\n", "text/plain")

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # probes every few seconds: not worth a line
        pass


@contextmanager
def serve_probes(port: int, host: str = "127.0.0.1") -> Iterator[int]:
    """Serve the four paths on ``host:port`` while the block runs; yields the bound port (``port`` 0: a free one)."""
    server = ThreadingHTTPServer((host, port), _ProbeHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="probes", daemon=True)
    thread.start()
    bound = int(server.server_address[1])
    log.info("serving /metrics, /healthz and /readyz on http://%s:%d", host, bound)
    try:
        yield bound
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
