"""One OpenTelemetry SERVER span per HTTP request, the first link of an execution's trace.

A plain ASGI middleware (Starlette's ``BaseHTTPMiddleware`` costs a task and a stream per request, and
the instrumentation packages are more than we need). It continues an incoming W3C ``traceparent``, names
the span ``"{method} {route}"`` once routing has matched (the template, not the raw path, so span names
stay few), and records the stable HTTP semantic-convention attributes. Handlers run inside the span, so
``telemetry.traceparent()`` there is this span's — the job stores it and the dispatch and the handler
run join the same trace.
"""

from __future__ import annotations

from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from sundial_common.observability.tracing import context_from, tracer

# Probes and scrapes hit these every few seconds; a span each would bury the traces people look for.
UNTRACED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


class TracingMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNTRACED_PATHS:
            await self.app(scope, receive, send)
            return
        method: str = scope["method"]
        parent = context_from(_header(scope, b"traceparent"))
        with tracer.start_as_current_span(
            method, context=parent, kind=SpanKind.SERVER, record_exception=False, set_status_on_exception=False
        ) as span:
            if span.is_recording():
                span.set_attribute("http.request.method", method)
                span.set_attribute("url.path", scope["path"])
                span.set_attribute("url.scheme", scope.get("scheme", "http"))
                if (client := scope.get("client")) is not None:
                    span.set_attribute("client.address", client[0])
                if (agent := _header(scope, b"user-agent")) is not None:
                    span.set_attribute("user_agent.original", agent)

            async def send_and_record(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                    span.set_attribute("http.response.status_code", status)
                    # For a SERVER span only 5xx is an error: a 4xx is the client's mistake, answered well.
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR))
                await send(message)

            try:
                await self.app(scope, receive, send_and_record)
            except BaseException as exc:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise
            finally:
                route = getattr(scope.get("route"), "path", None)
                if route:
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
