"""``/v1/stats``: the tenant's execution history, answered from the ClickHouse replica.

* ``GET /v1/stats/executions?from&to&interval=hour|day&groupBy=state|pool|handler`` — per bucket (and
  group): counts, failure rate, lateness and duration percentiles.
* ``GET /v1/stats/handlers?from&to&limit`` — the slowest and the most failing handlers.

The replica belongs to the analytics service (with the embedded chDB engine, its process alone may open
the data), so the API validates the parameters, scopes them to the token's tenant and forwards them to the
service's loopback endpoint (``SUNDIAL_ANALYTICS_URL``); the same path serves a ClickHouse server. Stats lag
Postgres by the replication delay (seconds) and include executions that Postgres retention already deleted.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from uuid import UUID

import httpx
from fastapi import APIRouter, Query
from sundial_common.domain.ids import id_time

from sundial_api.auth import Authenticated
from sundial_api.models.stats import ExecutionStats, HandlerRanking
from sundial_api.problems import ProblemError, field_error, responses
from sundial_api.responses import OrjsonResponse
from sundial_api.schedule import parse_instant
from sundial_api.state import ApiState, State

router = APIRouter(prefix="/v1/stats", tags=["stats"])

INTERVALS = {"hour": timedelta(hours=1), "day": timedelta(days=1)}
GROUPS = ("state", "pool", "handler")
#: Most buckets one query may span: a month of hours, 400 days (the replica's default TTL) of days.
MAX_BUCKETS = {"hour": 24 * 31, "day": 400}

From = Annotated[
    str | None,
    Query(alias="from", description="RFC 3339 instant (UTC if no offset); default: `to` minus 24 h (hour) or 30 d."),
]
To = Annotated[
    str | None, Query(alias="to", description="RFC 3339 instant, exclusive (UTC if no offset); default: now.")
]


def _instant(raw: str | None, field: str, errors: list[dict[str, str]]) -> datetime | None:
    if raw is None:
        return None
    try:
        value = parse_instant(raw)
    except ValueError as exc:
        errors.append(field_error(field, str(exc)))
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _window(
    state: ApiState, raw_from: str | None, raw_to: str | None, interval: str, errors: list[dict[str, str]]
) -> tuple[datetime, datetime]:
    start, end = _instant(raw_from, "from", errors), _instant(raw_to, "to", errors)
    end = end or state.clock.now()
    step = INTERVALS.get(interval, INTERVALS["hour"])
    start = start or end - (timedelta(days=1) if step == INTERVALS["hour"] else timedelta(days=30))
    if not errors and start >= end:
        errors.append(field_error("to", "must be after `from`"))
    elif not errors and interval in MAX_BUCKETS and (end - start) / step > MAX_BUCKETS[interval]:
        errors.append(
            field_error(
                "from", f"spans more than {MAX_BUCKETS[interval]} {interval}s; narrow it or use a longer interval"
            )
        )
    return start, end


def _check(errors: list[dict[str, str]]) -> None:
    if errors:
        raise ProblemError(422, "; ".join(f"`{e['field']}` {e['message']}" for e in errors), errors=errors)


async def _ask(state: ApiState, path: str, params: dict[str, Any]) -> Any:
    settings = state.settings
    try:
        async with httpx.AsyncClient(base_url=settings.analytics_url, timeout=settings.analytics_timeout_sec) as http:
            answer = await http.get(path, params=params)
    except httpx.HTTPError as exc:
        raise ProblemError(
            503, f"the analytics service is unreachable ({type(exc).__name__}); retry", headers={"Retry-After": "5"}
        ) from None
    if answer.status_code != 200:
        raise ProblemError(
            503, f"the analytics service answered {answer.status_code}; retry", headers={"Retry-After": "5"}
        )
    return answer.json()


@router.get(
    "/executions",
    response_model=ExecutionStats,
    responses=responses(401, 422, 503),
    summary="Execution counts, failure rate, lateness and duration percentiles per hour or day",
)
async def execution_stats(
    state: State,
    principal: Authenticated,
    raw_from: From = None,
    raw_to: To = None,
    interval: Annotated[str, Query(description="Bucket size: `hour` or `day`.")] = "hour",
    group_by: Annotated[
        str | None, Query(alias="groupBy", description="Split each bucket by `state`, `pool` or `handler`.")
    ] = None,
) -> OrjsonResponse:
    errors: list[dict[str, str]] = []
    if interval not in INTERVALS:
        errors.append(field_error("interval", f"must be `hour` or `day`, not `{interval}`"))
    if group_by is not None and group_by not in GROUPS:
        errors.append(field_error("groupBy", f"must be `state`, `pool` or `handler`, not `{group_by}`"))
    start, end = _window(state, raw_from, raw_to, interval, errors)
    _check(errors)
    params = {"tenant": principal.tenant, "from": start.isoformat(), "to": end.isoformat(), "interval": interval}
    if group_by:
        params["groupBy"] = group_by
    answer = await _ask(state, "/stats/executions", params)
    return OrjsonResponse(
        {
            "from": start.isoformat().replace("+00:00", "Z"),
            "to": end.isoformat().replace("+00:00", "Z"),
            "interval": interval,
            "groupBy": group_by,
            "items": answer["items"],
        }
    )


@router.get(
    "/handlers",
    response_model=HandlerRanking,
    responses=responses(401, 422, 503),
    summary="The slowest and the most failing handlers",
)
async def handler_stats(
    state: State,
    principal: Authenticated,
    raw_from: From = None,
    raw_to: To = None,
    limit: Annotated[int, Query(ge=1, le=100, description="Handlers per list (1–100).")] = 10,
) -> OrjsonResponse:
    errors: list[dict[str, str]] = []
    start, end = _window(state, raw_from, raw_to, "day", errors)
    _check(errors)
    params = {"tenant": principal.tenant, "from": start.isoformat(), "to": end.isoformat(), "limit": limit}
    answer = await _ask(state, "/stats/handlers", params)
    return OrjsonResponse(
        {
            "from": start.isoformat().replace("+00:00", "Z"),
            "to": end.isoformat().replace("+00:00", "Z"),
            "slowest": answer["slowest"],
            "mostFailing": answer["mostFailing"],
        }
    )


async def expired_execution(state: ApiState, tenant: str, execution_id: UUID) -> ProblemError | None:
    """The 410 for an execution that Postgres retention deleted, or None if it cannot have been one.

    Execution ids are UUIDv7, so an id minted before the retention horizon may name an execution that
    finished and left Postgres. The replica says whether it was this tenant's (its last state goes into
    the problem); if the analytics service cannot answer, the 410 still says where such history lives.
    """
    days = state.settings.execution_retention_days
    minted = id_time(execution_id)
    if days == 0 or minted is None or minted > state.clock.now() - timedelta(days=days):
        return None
    day = minted.replace(hour=0, minute=0, second=0, microsecond=0)
    history = (
        f"/v1/stats/executions?from={day.isoformat().replace('+00:00', 'Z')}"
        f"&to={(day + timedelta(days=2)).isoformat().replace('+00:00', 'Z')}&interval=day&groupBy=state"
    )
    last_known = ""
    try:
        async with httpx.AsyncClient(base_url=state.settings.analytics_url, timeout=2.0) as http:
            answer = await http.get(f"/executions/{execution_id}", params={"tenant": tenant})
        if answer.status_code == 404:
            return None
        if answer.status_code == 200:
            row = answer.json()
            last_known = f" It ended {row['state']} after {row['attempt']} attempt(s)."
    except httpx.HTTPError:
        pass
    return ProblemError(
        410,
        f"execution {execution_id} finished more than {days:g} days ago and was removed from Postgres "
        f"(SUNDIAL_EXECUTION_RETENTION_DAYS).{last_known} Its history is kept in ClickHouse: GET {history}",
        headers={"Link": f'<{history}>; rel="related"'},
        slug="execution-expired",
    )
