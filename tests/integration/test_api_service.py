"""The HTTP API as an operator runs it, on real Postgres and Redis: its answers while Redis or Postgres is down,
its probes, metrics and OpenAPI document, and the trace a request continues.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from importlib.metadata import version

import httpx
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sundial_api import ApiSettings, create_app
from sundial_infra.stack import LocalStack

from tests.support.api import POOLS, SECRET, TENANT, Api, api, error_fields, one_shot, rfc3339
from tests.support.tenants import tenant_token

__all__ = ["api"]  # the fixtures


async def test_a_job_is_accepted_when_redis_is_down(database_url: str) -> None:
    # Postgres is the truth (DESIGN invariant 1): the hydrator's overdue scan adds the member later.
    settings = ApiSettings(
        database_url=database_url, redis_url="redis://127.0.0.1:9/0", jwt_secret=SECRET, redis_timeout_sec=0.2
    )
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api.test") as client,
    ):
        headers = {"Authorization": f"Bearer {tenant_token(database_url, TENANT, secret=SECRET, pools=POOLS)}"}
        body = one_shot(runAt=rfc3339(datetime.now(UTC) + timedelta(minutes=1)))
        created = await client.post("/v1/jobs", json=body, headers=headers)
        cancelled = await client.delete(f"/v1/jobs/{created.json()['jobId']}", headers=headers)
        ready = await client.get("/readyz")

    assert created.status_code == 201, created.text
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "CANCELLED"
    assert ready.status_code == 503
    assert ready.json()["checks"]["postgres"] == "ok" and ready.json()["checks"]["redis"] != "ok"


async def test_requests_get_503_while_postgres_is_down(api: Api, stack: LocalStack) -> None:
    stack.postgres.stop()
    try:
        created = await api.create(one_shot())
        read = await api.client.get(f"/v1/jobs/{uuid.uuid4()}", headers=api.auth())
        ready = await api.client.get("/readyz")
    finally:
        stack.postgres.start()

    for response in (created, read, ready):
        assert response.status_code == 503, response.text
        error_fields(response)
    assert created.headers["retry-after"] == "1"
    assert ready.json()["checks"]["postgres"] != "ok" and ready.json()["checks"]["redis"] == "ok"
    # The pool reconnects on its own once Postgres is back.
    assert (await api.create(one_shot())).status_code == 201


async def test_the_api_serves_its_metrics(api: Api) -> None:
    response = await api.client.get("/metrics")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    # The process collector and Sundial's own loop metrics, from the one registry every process serves.
    assert "process_cpu_seconds_total" in response.text
    assert "# TYPE sundial_loop_passes_total counter" in response.text
    # Prometheus' text format, not part of the JSON API.
    assert "/metrics" not in (await api.client.get("/openapi.json")).json()["paths"]


async def test_probes_answer_without_a_token(api: Api) -> None:
    assert (await api.client.get("/healthz")).json() == {"status": "ok"}
    ready = await api.client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "checks": {"postgres": "ok", "redis": "ok"}}
    assert (await api.client.get("/version")).json() == {"version": version("sundial-common")}


async def test_openapi_documents_the_api(api: Api) -> None:
    response = await api.client.get("/openapi.json")

    assert response.status_code == 200
    spec = response.json()
    assert spec["info"]["title"] == "Sundial"
    assert {
        "/v1/jobs",
        "/v1/jobs/{job_id}",
        "/v1/jobs/{job_id}/executions",
        "/v1/jobs/{job_id}/pause",
        "/v1/jobs/{job_id}/resume",
        "/v1/jobs/{job_id}/trigger",
        "/v1/jobs/{job_id}/preview",
        "/v1/schedules:preview",
        "/v1/executions/{execution_id}",
        "/v1/jobs/{job_id}:backfill",
        "/v1/backfills/{backfill_id}",
        "/v1/backfills/{backfill_id}/cancel",
        "/v1/breakers",
        "/v1/breakers/{breaker_id}:open",
        "/v1/breakers/{breaker_id}:close",
        "/v1/jobs:by-key/{key}",
        "/healthz",
        "/readyz",
    } <= set(spec["paths"])
    assert "patch" in spec["paths"]["/v1/jobs/{job_id}"]
    create = spec["paths"]["/v1/jobs"]["post"]
    assert "Idempotency-Key" in [p["name"] for p in create["parameters"]]
    assert create["responses"]["422"]["content"]["application/problem+json"]["schema"]["$ref"].endswith("/Problem")
    job_create = spec["components"]["schemas"]["JobCreate"]
    assert {
        "name",
        "type",
        "runAt",
        "delaySeconds",
        "timezone",
        "target",
        "payload",
        "retryPolicy",
        "timeoutSec",
        "priority",
        "schedule",
        "intervalSec",
        "runList",
        "startAt",
        "endAt",
        "maxRuns",
        "jitterSec",
        "overlapPolicy",
        "catchupPolicy",
        "catchupWindowSec",
        "labels",
        "breaker",
        "dependsOn",
        "key",
    } == set(job_create["properties"])
    assert job_create["additionalProperties"] is False
    assert spec["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"


async def test_the_request_span_continues_the_callers_trace_and_the_job_keeps_it(
    api: Api, spans: InMemorySpanExporter
) -> None:
    caller_trace = "0af7651916cd43dd8448eb211c80319c"
    incoming = f"00-{caller_trace}-b7ad6b7169203331-01"

    response = await api.client.post("/v1/jobs", json=one_shot(), headers={**api.auth(), "traceparent": incoming})

    assert response.status_code == 201
    stored = await api.db.fetchval("SELECT traceparent FROM jobs")
    # Exactly one SERVER span per request: FastAPI's built-in instrumentation is off. (The replica's own loops,
    # such as the notification sender, trace their passes too: those are not the request's.)
    request_spans = [s for s in spans.get_finished_spans() if "sundial.loop" not in (s.attributes or {})]
    assert [s.name for s in request_spans] == ["POST /v1/jobs"]
    (span,) = request_spans
    assert span.kind == trace.SpanKind.SERVER
    assert format(span.context.trace_id, "032x") == caller_trace
    assert span.parent is not None and format(span.parent.span_id, "016x") == "b7ad6b7169203331"
    assert stored == f"00-{caller_trace}-{format(span.context.span_id, '016x')}-01"
    attributes = dict(span.attributes or {})
    assert attributes["http.route"] == "/v1/jobs"
    assert attributes["http.response.status_code"] == 201

    await api.client.get(f"/v1/jobs/{response.json()['jobId']}", headers=api.auth())
    assert "GET /v1/jobs/{job_id}" in [s.name for s in spans.get_finished_spans()]
