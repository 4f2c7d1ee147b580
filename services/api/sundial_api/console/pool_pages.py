"""The console's pools page: the pools open to the tenant, who serves them, and its retry circuit breakers.

Pools are ``GET /v1/pools`` and breakers ``GET /v1/breakers``, as the session's principal. Each pool's live
workers (their handlers and free slots, from the workers' announcements), the tenant's own backlog and the "no
live worker" warning are worded as ``GET /v1/pools/{name}`` words them (the same
:class:`~sundial_common.coordination.pool_service.PoolService` and ``render_service``), so the page and the API
never disagree about whether anyone serves a pool; they are read for all the page's pools at once, one Redis
read and one Postgres query per refresh however many pools. When the announcements cannot be read now, the page
says so instead of claiming no worker. Opening or closing a breaker is ``POST /v1/breakers/{id}/open|close``
(audited as the API audits it), after the form's confirmation box is ticked.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Path, Request
from redis.exceptions import RedisError
from starlette.responses import RedirectResponse, Response
from sundial_common.coordination.pool_service import PoolService
from sundial_common.security.auth import Principal

from sundial_api import breakers, pools
from sundial_api.console.answers import answer
from sundial_api.console.guard import ConsoleRoute, Signed, read_form
from sundial_api.console.pool_target_pages import with_targets
from sundial_api.console.render import page
from sundial_api.pool_workers import render_service
from sundial_api.problems import ProblemError
from sundial_api.responses import dumps
from sundial_api.state import ApiState, State

log = logging.getLogger("sundial.api.console")

router = APIRouter(prefix="/ui", route_class=ConsoleRoute, include_in_schema=False)

_REDIS_TROUBLE = (RedisError, OSError, TimeoutError)

BreakerId = Annotated[str, Path(max_length=64)]


async def serving(state: ApiState, principal: Principal, listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each pool of ``listed`` with its ``service``: ``GET /v1/pools/{name}``'s workers, backlog and warnings
    (None for every pool when the workers' announcements cannot be read now)."""
    names = [p["name"] for p in listed]
    try:
        workers = await state.live_workers.announcements.live_pools(names) if names else {}
    except _REDIS_TROUBLE as exc:
        log.warning("console: live workers unknown: %r", exc)
        return [{**p, "service": None} for p in listed]
    backlog = await state.stores.executions.pending_by_pool(principal.tenant, None)
    served = []
    for p in listed:
        pending, oldest = backlog.get(p["name"], (0, None))
        service = PoolService(p["name"], tuple(workers.get(p["name"], ())), pending, oldest)
        served.append({**p, "service": orjson.loads(dumps(render_service(service)))})
    return served


@router.get("/pools")
async def pools_page(request: Request, state: State, session: Signed) -> Response:
    principal = session.principal
    pool_list, breaker_list = await asyncio.gather(
        answer(pools.my_pools(state, principal, limit=100, cursor=None)),
        answer(breakers.list_breakers(state, principal, pool=None, breaker_state=None)),
    )
    served = await with_targets(state, principal, await serving(state, principal, pool_list["items"]))
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
