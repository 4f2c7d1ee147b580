"""The analytics service's loopback HTTP endpoint: the history queries the API forwards, answered from the replica.

Only the active replica serves it (it owns the chDB engine; with a ClickHouse server the path is the same).
The API validates the public parameters and scopes them to the caller's tenant; this endpoint trusts it and
only rejects what it cannot parse (400). Responses are already in the public, camelCase shape.

* ``GET /stats/executions?tenant&from&to&interval&groupBy`` — per bucket (and group): counts, failure rate,
  lateness and duration percentiles.
* ``GET /stats/handlers?tenant&from&to&limit`` — the slowest and the most failing handlers.
* ``GET /executions/{id}?tenant`` — an execution's last known state (for one gone from Postgres).
* ``GET /counts`` — executions per tenant × state × day (the convergence check).
* ``GET /healthz``.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sundial_analytics.replica import BUCKETS, GROUPS, Replica

FAILED_STATES = ("FAILED", "TIMED_OUT", "FAILED_WORKER_LOST", "DEAD")


class BadRequest(Exception):
    pass


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body, default=_default), status_code=status, media_type="application/json")


def _default(value: Any) -> Any:
    if isinstance(value, UUID):
        return str(value)
    raise TypeError


def _instant(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _percentiles(values: list[float]) -> dict[str, float | None]:
    # quantiles() of no values (nothing finished yet) is NaN; JSON says null.
    p50, p95, p99 = (None if v is None or math.isnan(v) else round(float(v), 1) for v in values)
    return {"p50": p50, "p95": p95, "p99": p99}


def _rate(failed: int, finished: int) -> float | None:
    return round(failed / finished, 4) if finished else None


def _param(request: Request, name: str) -> str:
    value = request.query_params.get(name)
    if not value:
        raise BadRequest(f"missing {name}")
    return value


def _time(request: Request, name: str) -> datetime:
    try:
        value = datetime.fromisoformat(_param(request, name))
    except ValueError:
        raise BadRequest(f"{name} is not an ISO instant") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def render_execution_stats(rows: list[dict[str, Any]], group_by: str | None) -> list[dict[str, Any]]:
    items = []
    for row in rows:
        ended = row["executions"] - row["open"]
        bucket: datetime = row["bucket"]
        items.append(
            {
                "start": _instant(bucket if bucket.tzinfo else bucket.replace(tzinfo=UTC)),
                "group": row["grp"] if group_by else None,
                "executions": row["executions"],
                "succeeded": row["succeeded"],
                "failed": row["failed"],
                "open": row["open"],
                "failureRate": _rate(row["failed"], ended),
                "latenessMs": _percentiles(row["lateness"]),
                "durationMs": _percentiles(row["duration"]),
            }
        )
    return items


def render_handler_stats(rows: list[dict[str, Any]], limit: int) -> dict[str, list[dict[str, Any]]]:
    handlers = [
        {
            "pool": row["pool"],
            "handler": row["handler"],
            "executions": row["executions"],
            "succeeded": row["succeeded"],
            "failed": row["failed"],
            "failureRate": _rate(row["failed"], row["succeeded"] + row["failed"]),
            "durationMs": _percentiles(row["duration"]),
            "topErrorClass": row["top_error"][0] if row["top_error"] else None,
        }
        for row in rows
    ]
    slowest = sorted(
        (h for h in handlers if h["durationMs"]["p95"] is not None),
        key=lambda h: (-h["durationMs"]["p95"], h["pool"], h["handler"]),
    )
    failing = sorted(
        (h for h in handlers if h["failed"]), key=lambda h: (-h["failureRate"], -h["failed"], h["pool"], h["handler"])
    )
    return {"slowest": slowest[:limit], "mostFailing": failing[:limit]}


def create_app(replica: Replica) -> Starlette:
    async def execution_stats(request: Request) -> Response:
        interval = request.query_params.get("interval", "hour")
        group_by = request.query_params.get("groupBy") or None
        if interval not in BUCKETS or group_by not in GROUPS:
            raise BadRequest("unknown interval or groupBy")
        rows = await replica.execution_stats(
            _param(request, "tenant"), _time(request, "from"), _time(request, "to"), interval, group_by
        )
        return _json({"items": render_execution_stats(rows, group_by)})

    async def handler_stats(request: Request) -> Response:
        try:
            limit = int(request.query_params.get("limit", "10"))
        except ValueError:
            raise BadRequest("limit is not an integer") from None
        rows = await replica.handler_stats(_param(request, "tenant"), _time(request, "from"), _time(request, "to"))
        return _json(render_handler_stats(rows, limit))

    async def execution(request: Request) -> Response:
        try:
            execution_id = UUID(request.path_params["execution_id"])
        except ValueError:
            raise BadRequest("not an execution id") from None
        row = await replica.find_execution(_param(request, "tenant"), execution_id)
        if row is None:
            return _json({"found": False}, 404)
        return _json(
            {
                "executionId": row["execution_id"],
                "state": row["state"],
                "attempt": row["attempt"],
                "pool": row["pool"],
                "handler": row["handler"],
                "scheduledFor": _instant(row["scheduled_for"]),
                "finishedAt": None if row["finished_at"] is None else _instant(row["finished_at"]),
            }
        )

    async def counts(request: Request) -> Response:
        rows = await replica.state_counts()
        return _json([[r["tenant_id"], r["state"], r["day"].isoformat(), r["executions"]] for r in rows])

    async def healthz(request: Request) -> Response:
        return _json({"status": "ok"})

    async def bad_request(request: Request, exc: Exception) -> Response:
        return _json({"detail": str(exc)}, 400)

    return Starlette(
        routes=[
            Route("/stats/executions", execution_stats),
            Route("/stats/handlers", handler_stats),
            Route("/executions/{execution_id}", execution),
            Route("/counts", counts),
            Route("/healthz", healthz),
        ],
        exception_handlers={BadRequest: bad_request},
    )
