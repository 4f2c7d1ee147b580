"""The console's pools page: the pools open to the tenant, who serves them, and its retry circuit breakers.

Pools are ``GET /v1/pools`` and breakers ``GET /v1/breakers``, as the session's principal. Each pool's live
workers (their handlers and free slots, from the workers' announcements), the tenant's own backlog and the "no
live worker" warning are ``GET /v1/pools/{name}``'s answer, so the page and the API never disagree about
whether anyone serves a pool; a pool whose workers cannot be read now says so instead of claiming none.
Opening or closing a breaker is ``POST /v1/breakers/{id}/open|close`` (audited as the API audits it), after
the form's confirmation box is ticked.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from starlette.responses import RedirectResponse, Response
from sundial_common.security.auth import Principal

from sundial_api import breakers, pool_workers, pools
from sundial_api.console.answers import answer
from sundial_api.console.guard import ConsoleRoute, Signed, read_form
from sundial_api.console.render import page
from sundial_api.problems import ProblemError
from sundial_api.state import ApiState, State

router = APIRouter(prefix="/ui", route_class=ConsoleRoute, include_in_schema=False)

BreakerId = Annotated[str, Path(max_length=64)]


async def serving(state: ApiState, principal: Principal, pool: dict[str, Any]) -> dict[str, Any]:
    """``pool`` with ``GET /v1/pools/{name}``'s live workers, backlog and warnings (``service: None`` when the
    workers' announcements cannot be read now)."""
    try:
        detail = await answer(pool_workers.get_pool(pool["name"], state, principal))
    except ProblemError as exc:
        if exc.status != 503:
            raise
        return {**pool, "service": None}
    return {**pool, "service": detail}


@router.get("/pools")
async def pools_page(request: Request, state: State, session: Signed) -> Response:
    principal = session.principal
    pool_list, breaker_list = await asyncio.gather(
        answer(pools.my_pools(state, principal, limit=100, cursor=None)),
        answer(breakers.list_breakers(state, principal, pool=None, breaker_state=None)),
    )
    served = await asyncio.gather(*(serving(state, principal, p) for p in pool_list["items"]))
    return page(
        request,
        "pools.html",
        {"pools": served, "breakers": breaker_list["items"]},
        live="pools_live.html",
    )


async def _confirmed(request: Request) -> None:
    if (await read_form(request)).get("confirm") != "yes":
        raise ProblemError(422, "tick the confirmation box to change a breaker", errors=[{"field": "confirm",
                           "message": "is required"}])  # fmt: skip


@router.post("/breakers/{breaker_id}/open")
async def open_breaker(request: Request, state: State, session: Signed, breaker_id: BreakerId) -> Response:
    await _confirmed(request)
    await breakers.open_breaker(breaker_id, state, session.principal)
    return RedirectResponse("/ui/pools?notice=breaker-opened", status_code=303)


@router.post("/breakers/{breaker_id}/close")
async def close_breaker(request: Request, state: State, session: Signed, breaker_id: BreakerId) -> Response:
    await _confirmed(request)
    await breakers.close_breaker(breaker_id, state, session.principal)
    return RedirectResponse("/ui/pools?notice=breaker-closed", status_code=303)
