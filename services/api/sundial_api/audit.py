"""``GET /v1/jobs/{id}/audit`` and ``GET /v1/executions/{id}/audit``: who changed what, and when.

Each answers from ``audit_log`` (:mod:`sundial_common.stores.audit`), oldest first, keyset-paged on the row id
(cursor ``a1:<id>``), tenant-scoped: another tenant's job or execution is a 404 like an unknown one. ``action``
narrows the trail, so "who cancelled this job?" is one call: ``GET /v1/jobs/{id}/audit?action=cancel``.
"""

from __future__ import annotations

import re
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Path, Query
from starlette.responses import Response
from sundial_common.security.auth import Principal
from sundial_common.stores.audit import Entity

from sundial_api.auth import Authenticated
from sundial_api.models.audit import AuditPage, render_entry
from sundial_api.pagination import InvalidCursor, decode_token, encode_token
from sundial_api.problems import invalid, not_found, parse_resource_id, responses
from sundial_api.responses import OrjsonResponse
from sundial_api.state import ApiState, State

router = APIRouter()

_CURSOR = re.compile(r"^a1:(\d{1,19})$")
_ACTION = r"^[a-z_]{1,40}$"

Limit = Annotated[int, Query(ge=1, le=200, description="Page size.")]
Cursor = Annotated[str | None, Query(description="`nextCursor` of the previous page; omit for the first page.")]
Actions = Annotated[
    list[Annotated[str, Query(pattern=_ACTION)]] | None,
    Query(alias="action", description="Only these actions (repeat for several), e.g. `cancel`."),
]


def _after(cursor: str | None) -> int:
    if cursor is None:
        return 0
    try:
        match = _CURSOR.match(decode_token(cursor))
    except InvalidCursor as exc:
        raise invalid("cursor", str(exc)) from None
    if match is None:
        raise invalid("cursor", "is not a cursor returned by this API")
    return int(match.group(1))


async def _page(
    state: ApiState,
    principal: Principal,
    entity: Entity,
    raw_id: str,
    cursor: str | None,
    actions: list[str] | None,
    limit: int,
) -> Response:
    ident: UUID = parse_resource_id(entity, raw_id)
    after = _after(cursor)
    entries = await state.stores.audit.entries(
        principal.tenant, entity, ident, after=after, actions=actions, limit=limit + 1
    )
    if not entries and after == 0:
        # An entity always has a first row (its create or dispatch) unless the filter removed them all: tell an
        # unknown (or another tenant's) entity from an empty selection.
        exists = (
            await state.stores.jobs.get_job(principal.tenant, ident)
            if entity == "job"
            else await state.stores.executions.get_execution(principal.tenant, ident)
        )
        if exists is None:
            raise not_found(entity, raw_id)
    page = entries[:limit]
    next_cursor = encode_token(f"a1:{page[-1].id}") if len(entries) > limit else None
    return OrjsonResponse({"items": [render_entry(entry) for entry in page], "nextCursor": next_cursor})


@router.get(
    "/v1/jobs/{job_id}/audit",
    tags=["jobs"],
    response_model=AuditPage,
    responses=responses(401, 404, 422, 503),
    summary="A job's audit trail: every change, who made it, when, the state before and after",
)
async def job_audit(
    job_id: Annotated[str, Path(description="The job's id. Unknown or another tenant's: 404.")],
    state: State,
    principal: Authenticated,
    action: Actions = None,
    limit: Limit = 100,
    cursor: Cursor = None,
) -> Response:
    """Oldest first. `?action=cancel` answers "who cancelled this job?" in one call."""
    return await _page(state, principal, "job", job_id, cursor, action, limit)


@router.get(
    "/v1/executions/{execution_id}/audit",
    tags=["executions"],
    response_model=AuditPage,
    responses=responses(401, 404, 422, 503),
    summary="An execution's audit trail: dispatch, each attempt's start and end, retries, cancels, who and when",
)
async def execution_audit(
    execution_id: Annotated[str, Path(description="The execution's id. Unknown or another tenant's: 404.")],
    state: State,
    principal: Authenticated,
    action: Actions = None,
    limit: Limit = 100,
    cursor: Cursor = None,
) -> Response:
    """Oldest first: every transition of every attempt, and every API call that changed it."""
    return await _page(state, principal, "execution", execution_id, cursor, action, limit)
