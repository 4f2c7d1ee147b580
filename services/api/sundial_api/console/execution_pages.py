"""The console's execution pages: one execution's story, the dead letters, and cancel / re-drive.

An execution page shows what ``GET /v1/executions/{id}`` answers — state, timings, fence token, trace link,
every attempt with its error, progress and (when the worker recorded one) traceback — and its audit trail.
The dead letters are ``GET /v1/executions?state=DEAD``, each with its own re-drive button
(``POST /v1/executions/{id}/retry``).
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from starlette.responses import RedirectResponse, Response

from sundial_api import audit, executions
from sundial_api.console.answers import answer
from sundial_api.console.guard import ConsoleRoute, Signed, read_form
from sundial_api.console.live import skip_unchanged
from sundial_api.console.render import page
from sundial_api.models.executions import ExecutionState
from sundial_api.problems import parse_resource_id
from sundial_api.state import State

router = APIRouter(prefix="/ui", route_class=ConsoleRoute, include_in_schema=False)

PAGE_SIZE = 50
ExecutionId = Annotated[str, Path(max_length=64)]


@router.get("/executions/{execution_id}")
async def execution_page(request: Request, state: State, session: Signed, execution_id: ExecutionId) -> Response:
    skip_unchanged(request, state, session)
    principal = session.principal
    execution, trail = await asyncio.gather(
        answer(executions.get_execution(execution_id, state, principal)),
        answer(audit.execution_audit(execution_id, state, principal, action=None, limit=100, cursor=None)),
    )
    return page(
        request, "execution.html", {"execution": execution, "audit": trail["items"]}, live="execution_live.html"
    )


@router.get("/dead-letters")
async def dead_letters_page(
    request: Request,
    state: State,
    session: Signed,
    pool: Annotated[str, Query(max_length=63)] = "",
    handler: Annotated[str, Query(max_length=128)] = "",
    cursor: Annotated[str, Query(max_length=200)] = "",
) -> Response:
    skip_unchanged(request, state, session)
    listing = await answer(
        executions.list_executions(
            state,
            session.principal,
            execution_state=[ExecutionState.DEAD],
            job_id=None,
            pool=pool or None,
            handler=handler or None,
            scheduled_from=None,
            scheduled_to=None,
            trace_id=None,
            limit=PAGE_SIZE,
            cursor=cursor or None,
        )
    )
    return page(
        request,
        "dead_letters.html",
        {
            "items": listing["items"],
            "next_cursor": listing["nextCursor"],
            "paged": bool(cursor),
            "filters": {"pool": pool, "handler": handler},
        },
        live="dead_letters_live.html",
    )


async def _back(request: Request, execution_id: str, notice: str) -> Response:
    """Back to where the action was asked: the dead letters (``from=dead-letters``) or the execution."""
    ident = parse_resource_id("execution", execution_id)
    if (await read_form(request)).get("from") == "dead-letters":
        return RedirectResponse(f"/ui/dead-letters?notice={notice}", status_code=303)
    return RedirectResponse(f"/ui/executions/{ident}?notice={notice}", status_code=303)


@router.post("/executions/{execution_id}/cancel")
async def cancel(request: Request, state: State, session: Signed, execution_id: ExecutionId) -> Response:
    response = await executions.cancel_execution(execution_id, state, session.principal)
    return await _back(request, execution_id, "cancel-requested" if response.status_code == 202 else "cancelled")


@router.post("/executions/{execution_id}/retry")
async def retry(request: Request, state: State, session: Signed, execution_id: ExecutionId) -> Response:
    await executions.retry_execution(execution_id, state, session.principal)
    return await _back(request, execution_id, "retried")
