"""The console's pools page: the pools open to the tenant and its retry circuit breakers, with open/close.

Pools are ``GET /v1/pools`` and breakers ``GET /v1/breakers``, as the session's principal; opening or closing a
breaker is ``POST /v1/breakers/{id}/open|close`` (audited as the API audits it), after the form's
confirmation box is ticked. Live workers per pool are not shown: no process announces them yet.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Path, Request
from starlette.responses import RedirectResponse, Response

from sundial_api import breakers, pools
from sundial_api.console.answers import answer
from sundial_api.console.guard import ConsoleRoute, Signed, read_form
from sundial_api.console.render import page
from sundial_api.problems import ProblemError
from sundial_api.state import State

router = APIRouter(prefix="/ui", route_class=ConsoleRoute, include_in_schema=False)

BreakerId = Annotated[str, Path(max_length=64)]


@router.get("/pools")
async def pools_page(request: Request, state: State, session: Signed) -> Response:
    principal = session.principal
    pool_list, breaker_list = await asyncio.gather(
        answer(pools.my_pools(state, principal, limit=100, cursor=None)),
        answer(breakers.list_breakers(state, principal, pool=None, breaker_state=None)),
    )
    return page(
        request,
        "pools.html",
        {"pools": pool_list["items"], "breakers": breaker_list["items"]},
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
