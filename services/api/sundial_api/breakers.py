"""``GET /v1/breakers``, ``GET /v1/breakers/{id}``, ``POST /v1/breakers/{id}:open`` and ``:close``.

A tenant's retry circuit breakers, one per (pool, handler) its attempts ran on, and the operator's hand on
them. The sweeper moves breakers by their window (:mod:`sundial_sweeper.breakers`); an operator may open one
(it then stays open, its retries held, until an operator closes it) or close one (its window starts again,
and the sweeper's breaker loop releases what it held within a pass, spread over ``releaseSpreadSec``). Each move is a
compare-and-set on the breaker's version with its audit row (``GET /v1/breakers/{id}/audit``).
"""

from __future__ import annotations

import logging
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Path, Query
from opentelemetry import trace
from starlette.responses import Response
from sundial_common.stores.breakers import CLOSED, OPEN, Breaker, Transition

from sundial_api.auth import Authenticated
from sundial_api.json_body import JsonRoute
from sundial_api.models.audit import AuditPage, render_entry
from sundial_api.models.breakers import BreakerList, BreakerState, BreakerView, render_breaker
from sundial_api.problems import ProblemError, not_found, parse_resource_id, responses
from sundial_api.responses import OrjsonResponse
from sundial_api.state import ApiState, State

log = logging.getLogger("sundial.api")

router = APIRouter(prefix="/v1", tags=["breakers"], route_class=JsonRoute)

BreakerId = Annotated[str, Path(description="The breaker's id (from `GET /v1/breakers`).")]


@router.get(
    "/breakers",
    response_model=BreakerList,
    responses=responses(401, 422, 503),
    summary="The tenant's retry circuit breakers: state, failure ratio, held retries, next probe",
)
async def list_breakers(
    state: State,
    principal: Authenticated,
    pool: Annotated[str | None, Query(description="Only this pool's breakers.")] = None,
    breaker_state: Annotated[
        BreakerState | None, Query(alias="state", description="Only breakers in this state.")
    ] = None,
) -> Response:
    rows = await state.stores.breakers.tenant_breakers(
        principal.tenant, pool, breaker_state.value if breaker_state is not None else None
    )
    return OrjsonResponse({"items": [render_breaker(b) for b in rows]})


@router.post(
    "/breakers/{breaker_id}:open",
    response_model=BreakerView,
    responses=responses(401, 404, 409, 503),
    summary="Open a breaker by hand: its handler's retries are held until an operator closes it",
)
async def open_breaker(breaker_id: BreakerId, state: State, principal: Authenticated) -> Response:
    current = await _get(state, principal.tenant, breaker_id)
    if current.state == OPEN and current.manual:
        return OrjsonResponse(render_breaker(current))
    moved = await state.stores.breakers.transition(
        Transition(
            current,
            OPEN,
            "opened_by_operator",
            principal.subject,
            cooldown_sec=current.cooldown_sec,
            manual=True,
            attempts=current.attempts,
            failures=current.failures,
        )
    )
    return OrjsonResponse(render_breaker(_moved(moved, breaker_id, "opened_by_operator")))


@router.post(
    "/breakers/{breaker_id}:close",
    response_model=BreakerView,
    responses=responses(401, 404, 409, 503),
    summary="Close a breaker by hand: its window starts again and its held retries are released, spread at random",
)
async def close_breaker(breaker_id: BreakerId, state: State, principal: Authenticated) -> Response:
    current = await _get(state, principal.tenant, breaker_id)
    moved = current
    if current.state != CLOSED or current.manual:
        moved = _moved(
            await state.stores.breakers.transition(
                Transition(current, CLOSED, "closed_by_operator", principal.subject, detail={"held": current.held})
            ),
            breaker_id,
            "closed_by_operator",
        )
    return OrjsonResponse(render_breaker(moved))


# After the `:open` and `:close` routes: the first route matching a path is the one whose methods a 405 lists.
@router.get(
    "/breakers/{breaker_id}", response_model=BreakerView, responses=responses(401, 404, 503), summary="A breaker"
)
async def get_breaker(breaker_id: BreakerId, state: State, principal: Authenticated) -> Response:
    return OrjsonResponse(render_breaker(await _get(state, principal.tenant, breaker_id)))


@router.get(
    "/breakers/{breaker_id}/audit",
    response_model=AuditPage,
    responses=responses(401, 404, 503),
    summary="A breaker's transitions, oldest first (the last 500)",
)
async def breaker_audit(breaker_id: BreakerId, state: State, principal: Authenticated) -> Response:
    current = await _get(state, principal.tenant, breaker_id)
    entries = await state.stores.audit.entries(principal.tenant, "breaker", current.id, limit=500)
    return OrjsonResponse({"items": [render_entry(e) for e in entries], "nextCursor": None})


async def _get(state: ApiState, tenant: str, raw: str) -> Breaker:
    ident: UUID = parse_resource_id("breaker", raw)
    breaker = await state.stores.breakers.get_breaker(tenant, ident)
    if breaker is None:
        raise not_found("breaker", raw)
    return breaker


def _moved(moved: Breaker | None, raw: str, action: str) -> Breaker:
    if moved is None:
        raise ProblemError(409, f"breaker {raw} changed meanwhile; read it again and retry")
    # The span event of the transition, on the request's span (the sweeper's own moves get one each too).
    trace.get_current_span().add_event(
        f"breaker.{action}",
        {
            "sundial.tenant": moved.tenant_id,
            "sundial.pool": moved.pool,
            "sundial.handler": moved.handler,
            "sundial.breaker_id": str(moved.id),
            "sundial.breaker.state": moved.state,
        },
    )
    return moved
