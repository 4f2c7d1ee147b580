"""What the API records in the process's metrics registry (:mod:`sundial_common.observability.metrics`), served at
its own
``/metrics`` (:mod:`sundial_api.health`).

- ``sundial_api_requests_total`` and ``sundial_api_request_duration_seconds`` by ``route`` (the path template
  routing matched, ``/v1/jobs/{job_id}``: never a raw path, so ids never become labels; ``unmatched`` for a
  request no route matched), ``method`` and ``status``: :class:`RequestMetricsMiddleware`, a plain ASGI
  middleware beside the tracing one. Scrapes of ``/metrics`` itself are not counted.
- ``sundial_jobs_created_total{tenant,type}``: :func:`count_created`, by the create and batch-create routes
  for the jobs they stored (a replayed idempotent request stores nothing and counts nothing).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from sundial_common.observability.metrics import API_REQUEST_DURATION, API_REQUESTS, JOBS_CREATED, Children

#: The route label of a request no route matched (404s for unknown paths, whatever the path).
UNMATCHED = "unmatched"
_UNCOUNTED = frozenset({"/metrics"})

_requests: Children[Counter] = Children(API_REQUESTS)
_durations: Children[Histogram] = Children(API_REQUEST_DURATION)
_created: Children[Counter] = Children(JOBS_CREATED)


def count_created(jobs: Iterable[tuple[str, str]]) -> None:
    """Count stored jobs, given as (tenant, type) each."""
    counts: dict[tuple[str, str], int] = {}
    for key in jobs:
        counts[key] = counts.get(key, 0) + 1
    for key, n in counts.items():
        _created(*key).inc(n)


class RequestMetricsMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _UNCOUNTED:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client sees if the app raises before answering

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = getattr(scope.get("route"), "path", None) or UNMATCHED
            key = (route, scope["method"], str(status))
            _requests(*key).inc()
            _durations(*key).observe(time.perf_counter() - started)
