"""The console's bulk re-drive of the dead letters: the filtered list's action, its count seen before anything changes,
and the operation's live progress.

The dead letters page offers "Re-drive all matching" for its current filter (pool, handler). That first asks
``POST /v1/bulk-operations`` with ``dryRun`` — the exact count and a sample — and shows it with a confirmation; only
the confirmed form creates the operation, with the same filter, as the session's principal (its own rows only; the
runner acts at the operation's rate, through the retry breaker like any retry). The operation's page is
``GET /v1/bulk-operations/{id}``: state, counts and ETA, and a cancel while it runs. A skipped row writes no audit
row, so the live region is read on every refresh (as a replay's) rather than from the change feed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from starlette.responses import RedirectResponse, Response

from sundial_api import bulk_operations
from sundial_api.console.answers import answer
from sundial_api.console.guard import ConsoleRoute, Signed, read_form
from sundial_api.console.render import page
from sundial_api.models.bulk import NewBulkOperation
from sundial_api.problems import ProblemError, parse_resource_id
from sundial_api.state import State

router = APIRouter(prefix="/ui", route_class=ConsoleRoute, include_in_schema=False)

OperationId = Annotated[str, Path(max_length=64)]


def redrive_body(form: Mapping[str, str], *, dry_run: bool) -> NewBulkOperation:
    """The re-drive of the dead letters the form's filter selects (``state`` DEAD, and the pool and handler given)."""
    selected: dict[str, Any] = {"state": ["DEAD"]}
    for name in ("pool", "handler"):
        value = form.get(name, "").strip()
        if value:
            selected[name] = value
    return NewBulkOperation.model_validate(
        {"target": "executions", "action": "redrive", "filter": selected, "dryRun": dry_run}
    )


@router.post("/dead-letters/redrive")
async def redrive_matching(request: Request, state: State, session: Signed) -> Response:
    """Without ``confirm=yes``: the dry run's count and sample, with the form that confirms. With it: the operation."""
    form = await read_form(request)
    filters = {"pool": form.get("pool", "").strip(), "handler": form.get("handler", "").strip()}
    try:
        if form.get("confirm") != "yes":
            preview = await answer(
                bulk_operations.create_operation(redrive_body(form, dry_run=True), state, session.principal, None)
            )
            return page(request, "bulk_confirm.html", {"preview": preview, "filters": filters, "problem": None})
        created = await answer(
            bulk_operations.create_operation(redrive_body(form, dry_run=False), state, session.principal, None)
        )
    except ProblemError as exc:
        if exc.status >= 500:
            raise
        context = {"preview": None, "filters": filters, "problem": exc.detail}
        return page(request, "bulk_confirm.html", context, status_code=exc.status)
    return RedirectResponse(f"/ui/bulk/{created['operationId']}", status_code=303)


@router.get("/bulk/{operation_id}")
async def operation_page(request: Request, state: State, session: Signed, operation_id: OperationId) -> Response:
    operation = await answer(bulk_operations.get_operation(operation_id, state, session.principal))
    return page(request, "bulk.html", {"op": operation}, live="bulk_live.html")


@router.post("/bulk/{operation_id}/cancel")
async def cancel(state: State, session: Signed, operation_id: OperationId) -> Response:
    await bulk_operations.cancel_operation(operation_id, state, session.principal)
    ident = parse_resource_id("bulk operation", operation_id)
    return RedirectResponse(f"/ui/bulk/{ident}?notice=cancelled", status_code=303)
