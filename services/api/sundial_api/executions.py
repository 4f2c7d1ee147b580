"""``/v1/executions``: one occurrence's whole story — state, every attempt, worker, timestamps and trace."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Path
from starlette.responses import Response

from sundial_api.auth import Authenticated
from sundial_api.models import ExecutionDetail, render_attempt, render_execution
from sundial_api.problems import not_found, parse_resource_id, responses
from sundial_api.responses import OrjsonResponse
from sundial_api.state import State

router = APIRouter(prefix="/v1/executions", tags=["executions"])

ExecutionId = Annotated[
    str, Path(description="The execution's id (a UUID). Unknown, malformed or another tenant's: 404.")
]


@router.get(
    "/{execution_id}",
    response_model=ExecutionDetail,
    responses=responses(401, 404, 503),
    summary="Read an execution with its attempts and trace",
)
async def get_execution(execution_id: ExecutionId, state: State, principal: Authenticated) -> Response:
    ident = parse_resource_id("execution", execution_id)
    # Both reads at once; the attempts are discarded unless the execution is this tenant's.
    execution, attempts = await asyncio.gather(
        state.store.get_execution(principal.tenant, ident), state.store.execution_attempts(ident)
    )
    if execution is None:
        raise not_found("execution", execution_id)
    view = render_execution(execution, state.settings.trace_link_template)
    view["attempts"] = [render_attempt(row) for row in attempts]
    return OrjsonResponse(view)
