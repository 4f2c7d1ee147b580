"""``/v1/bulk-operations``: one action on every job or execution of a tenant that a filter selects, run in the
background at a bounded rate, with its progress and each row's outcome.

* ``POST /v1/bulk-operations`` — validate and record the request (202, PREPARING): the runner (in
  ``sundial replayer``) fixes the selection — the rows the filter selects among those created up to the request,
  so rows made afterwards are never touched — and acts on it. ``dryRun`` answers the exact count and the first
  rows instead, creating nothing. Bad requests create nothing: an empty filter, an unknown field, an action the
  target has not, a reversed range, more than :data:`~sundial_common.stores.bulk.MAX_SELECTED` ids (422 naming
  the field). A tenant's token acts on its own rows; an admin token names one tenant (``tenantId``), never several.
* ``GET /v1/bulk-operations/{id}``, ``GET /v1/bulk-operations`` — state, total / done / skipped / failed, ETA.
* ``GET /v1/bulk-operations/{id}/items`` — each selected row's outcome and why, in the order acted on.
* ``POST /v1/bulk-operations/{id}/cancel`` — a PREPARING operation is CANCELLED at once; a RUNNING one stops
  before its next batch (202). A finished one: 409.
"""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Path, Query
from starlette.responses import Response
from sundial_common.security.auth import Principal
from sundial_common.stores import bulk as bulk_store
from sundial_common.stores.bulk import MAX_SELECTED, Selection
from sundial_common.stores.types import Record

from sundial_api.auth import Authenticated
from sundial_api.json_body import JsonRoute
from sundial_api.models.bulk import (
    BulkDryRun,
    BulkFilter,
    BulkItemList,
    BulkOperation,
    BulkOperationList,
    BulkTarget,
    NewBulkOperation,
    render_item,
    render_operation,
)
from sundial_api.operations import (
    IdempotencyKey,
    cancel_status,
    cancelled,
    checked_key,
    created_headers,
    cursor_fields,
    existing,
    page_of,
    page_start,
)
from sundial_api.pagination import encode_token
from sundial_api.problems import ProblemError, field_error, invalid, responses
from sundial_api.responses import OrjsonResponse
from sundial_api.state import ApiState, State

router = APIRouter(prefix="/v1/bulk-operations", tags=["bulk operations"], route_class=JsonRoute)

_CURSOR_PREFIX = "o1"
_ITEMS_CURSOR = re.compile(r"^oi1:(\d{1,19})$")
_EXECUTION_STATES = frozenset(
    {"PENDING", "RUNNING", "SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "FAILED_WORKER_LOST", "DEAD", "SKIPPED"}
)
_JOB_STATES = frozenset({"ACTIVE", "PAUSED", "COMPLETED", "CANCELLED"})

OperationId = Annotated[
    str, Path(description="The operation's id (a UUID). Unknown, malformed or another tenant's: 404.")
]


def _scope(principal: Principal) -> str | None:
    """Whose operations the caller sees: its tenant's, or (an admin) everyone's."""
    return None if principal.admin else principal.tenant


def _selection(target: BulkTarget, f: BulkFilter) -> Selection:
    """The filter checked against the target (422 naming the field)."""
    if not f.model_fields_set or all(getattr(f, name) is None for name in f.model_fields_set):
        raise invalid("filter", "selects every row: give at least one field (an empty filter is refused)")
    known = _EXECUTION_STATES if target is BulkTarget.EXECUTIONS else _JOB_STATES
    for state in f.state or ():
        if state not in known:
            raise invalid(
                "filter.state", f"`{state}` is not a state of {target.value} (one of {', '.join(sorted(known))})"
            )
    for low, high in (("scheduledFrom", "scheduledTo"), ("finishedFrom", "finishedTo")):
        start, end = getattr(f, _snake(low)), getattr(f, _snake(high))
        if start is not None and end is not None and end <= start:
            raise invalid(f"filter.{high}", f"must be after `{low}`")
    if target is BulkTarget.JOBS:
        for name in ("finishedFrom", "finishedTo"):
            if getattr(f, _snake(name)) is not None:
                raise invalid(f"filter.{name}", "applies to executions only: jobs do not finish")
    if f.job_ids is not None and len(f.job_ids) > MAX_SELECTED:
        raise invalid("filter.jobIds", f"names {len(f.job_ids)} ids; one operation takes at most {MAX_SELECTED}")
    return Selection(
        states=tuple(f.state) if f.state else None,
        pool=f.pool,
        handler=f.handler,
        labels=f.labels or None,
        name_prefix=f.name_prefix,
        priority=f.priority,
        scheduled_from=f.scheduled_from,
        scheduled_to=f.scheduled_to,
        finished_from=f.finished_from,
        finished_to=f.finished_to,
        job_ids=tuple(dict.fromkeys(f.job_ids)) if f.job_ids else None,
    )


def _snake(name: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def _tenant(principal: Principal, body: NewBulkOperation) -> str:
    if body.tenant_id is None or body.tenant_id == principal.tenant:
        return principal.tenant
    if not principal.admin:
        raise ProblemError(
            403,
            "a tenant's token acts only on its own rows: `tenantId` must be omitted or your tenant",
            errors=[field_error("tenantId", f"must be {principal.tenant} (or omitted)")],
        )
    return body.tenant_id


@router.post(
    "",
    status_code=202,
    response_model=BulkOperation,
    responses={
        **responses(401, 403, 422, 503),
        200: {"model": BulkDryRun, "description": "`dryRun`: the count and the first rows."},
    },
    summary="Act on every job or execution a filter selects",
    response_description="Accepted (PREPARING); `Location` points at the operation.",
)
async def create_operation(
    body: NewBulkOperation,
    state: State,
    principal: Authenticated,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """The selection is fixed at the request: only rows created up to it are ever touched. The runner acts on
    them at `ratePerSec`, one operation per tenant at a time, each row with the compare-and-swap its own endpoint
    uses (a row that no longer matches when its turn comes is *skipped*, with the reason), and audits each change
    with the operation's id."""
    key_hash = checked_key(idempotency_key, body)
    if body.action not in bulk_store.ACTIONS[body.target.value]:
        actions = ", ".join(bulk_store.ACTIONS[body.target.value])
        raise invalid("action", f"`{body.action}` is not an action on {body.target.value} (one of {actions})")
    selection = _selection(body.target, body.filter)
    tenant = _tenant(principal, body)
    if body.dry_run:
        preview = await state.stores.bulk.preview(tenant, body.target.value, body.action, selection)
        if preview.total > MAX_SELECTED:
            raise invalid("filter", f"selects {preview.total} rows; one operation takes at most {MAX_SELECTED}")
        return OrjsonResponse(
            {"target": body.target.value, "action": body.action, "count": preview.total, "sample": preview.sample}
        )
    # A selection beyond the limit is refused here, by a count that stops just past it, rather than accepted and
    # then FAILED by the runner (which still checks, at the request's watermark, for rows created meanwhile).
    # A key already used answers its operation whatever the rows now are: that is looked up first.
    if idempotency_key is None or await state.stores.bulk.by_key(tenant, idempotency_key) is None:
        over = await state.stores.bulk.count_up_to(tenant, body.target.value, body.action, selection, MAX_SELECTED + 1)
        if over > MAX_SELECTED:
            raise invalid(
                "filter", f"selects more than {MAX_SELECTED} rows; one operation takes at most {MAX_SELECTED}"
            )
    row, created = await state.stores.bulk.create(
        bulk_store.NewOperation(
            tenant_id=tenant,
            created_by=principal.subject,
            target=body.target.value,
            action=body.action,
            selection=selection,
            rate_per_sec=body.rate_per_sec,
            idempotency_key=idempotency_key,
            request_hash=key_hash,
        )
    )
    headers = created_headers(f"/v1/bulk-operations/{row['id']}", row, created, body, "bulk operation")
    return OrjsonResponse(render_operation(row, state.clock.now()), status_code=202, headers=headers)


@router.get(
    "",
    response_model=BulkOperationList,
    responses=responses(401, 422, 503),
    summary="List bulk operations, newest first",
)
async def list_operations(
    state: State,
    principal: Authenticated,
    limit: Annotated[int, Query(ge=1, le=200, description="Page size.")] = 50,
    cursor: Annotated[
        str | None, Query(description="`nextCursor` of the previous page; omit for the first page.")
    ] = None,
) -> Response:
    rows = await state.stores.bulk.list_operations(_scope(principal), page_start(_CURSOR_PREFIX, cursor), limit + 1)
    page, next_cursor = page_of(_CURSOR_PREFIX, rows, limit)
    now = state.clock.now()
    return OrjsonResponse({"items": [render_operation(r, now) for r in page], "nextCursor": next_cursor})


async def _existing(state: ApiState, principal: Principal, operation_id: str) -> Record:
    return await existing("bulk operation", operation_id, lambda ident: state.stores.bulk.get(ident, _scope(principal)))


@router.get(
    "/{operation_id}",
    response_model=BulkOperation,
    responses=responses(401, 404, 503),
    summary="A bulk operation and its progress",
)
async def get_operation(operation_id: OperationId, state: State, principal: Authenticated) -> Response:
    return OrjsonResponse(render_operation(await _existing(state, principal, operation_id), state.clock.now()))


@router.get(
    "/{operation_id}/items",
    response_model=BulkItemList,
    responses=responses(401, 404, 422, 503),
    summary="Each selected row's outcome, in the order acted on",
)
async def list_items(
    operation_id: OperationId,
    state: State,
    principal: Authenticated,
    outcome: Annotated[
        str | None, Query(pattern="^(DONE|SKIPPED|FAILED)$", description="Only rows with this outcome.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="Page size.")] = 100,
    cursor: Annotated[
        str | None, Query(description="`nextCursor` of the previous page; omit for the first page.")
    ] = None,
) -> Response:
    after = cursor_fields(cursor, _ITEMS_CURSOR)[0] if cursor is not None else 0
    row = await _existing(state, principal, operation_id)
    rows = await state.stores.bulk.items(row["id"], after, limit + 1, outcome)
    page = rows[:limit]
    next_cursor = encode_token(f"oi1:{page[-1]['seq']}") if len(rows) > limit else None
    return OrjsonResponse({"items": [render_item(r) for r in page], "nextCursor": next_cursor})


@router.post(
    "/{operation_id}/cancel",
    response_model=BulkOperation,
    responses={
        202: {"model": BulkOperation, "description": "RUNNING: the runner stops before its next batch."},
        **responses(401, 404, 409, 503),
    },
    summary="Cancel a bulk operation",
    response_description="PREPARING: now CANCELLED.",
)
async def cancel_operation(operation_id: OperationId, state: State, principal: Authenticated) -> Response:
    """Rows already acted on stay so; no row is acted on after the cancel is answered 200, nor after the
    runner's batch in flight when answered 202. Asking again is harmless; a finished operation: 409."""
    scope = _scope(principal)
    row = await cancelled(
        "bulk operation",
        operation_id,
        lambda ident: state.stores.bulk.cancel(ident, scope),
        lambda ident: state.stores.bulk.get(ident, scope),
        "it has finished",
    )
    return OrjsonResponse(render_operation(row, state.clock.now()), status_code=cancel_status(row))
