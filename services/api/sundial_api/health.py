"""Probes and scrapes: ``/healthz`` (the process is up), ``/readyz`` (it can serve: Postgres and Redis
answer), ``/version`` (the release it runs) and ``/metrics`` (the process's Prometheus metrics,
:mod:`sundial_common.observability.metrics`).

None needs a token — orchestrators, load balancers and Prometheus call them — and none is traced.
``/metrics`` is left out of the OpenAPI document: it is Prometheus' text format, not part of the JSON API.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from fastapi import APIRouter, Request
from starlette.responses import Response
from sundial_common.observability.metrics import exposition
from sundial_common.observability.probes import version

from sundial_api.models.common import Health, Readiness
from sundial_api.problems import problem_body, responses
from sundial_api.responses import OrjsonResponse, ProblemResponse
from sundial_api.state import State

router = APIRouter(tags=["health"])

# A readiness probe must answer before the orchestrator's own timeout (commonly 1–3 s).
CHECK_TIMEOUT_SEC = 1.0


async def _check(probe: Awaitable[object]) -> str:
    try:
        await asyncio.wait_for(probe, CHECK_TIMEOUT_SEC)
    except TimeoutError:
        return f"no answer within {CHECK_TIMEOUT_SEC:g} s"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    return "ok"


@router.get("/healthz", response_model=Health, summary="Liveness: the process is up")
async def healthz() -> Response:
    return OrjsonResponse({"status": "ok"})


@router.get("/version", summary="The Sundial release this process runs")
async def release() -> Response:
    return OrjsonResponse({"version": version()})


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    # OpenMetrics when Prometheus asks for it: only that format carries the lateness exemplars (trace ids).
    body, content_type = exposition(request.headers.get("accept"))
    return Response(body, media_type=content_type)


@router.get(
    "/readyz",
    response_model=Readiness,
    responses=responses(503),
    summary="Readiness: Postgres and Redis answer",
)
async def readyz(state: State) -> Response:
    postgres, redis = await asyncio.gather(_check(state.stores.database.ping()), _check(state.hot_window.redis.ping()))
    checks = {"postgres": postgres, "redis": redis}
    if postgres == "ok" and redis == "ok":
        return OrjsonResponse({"status": "ready", "checks": checks})
    failing = ", ".join(name for name, result in checks.items() if result != "ok")
    body = problem_body(503, f"not ready: {failing} unavailable")
    body["checks"] = checks  # an RFC 9457 extension member: what each dependency answered
    return ProblemResponse(body, status_code=503)
