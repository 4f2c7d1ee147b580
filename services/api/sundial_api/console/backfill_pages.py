"""The console's backfills: a recurring job's backfills with their progress, a new one (a dry run first, then the
real one with its count), one backfill followed live, and its cancel.

Reads and actions are the ``/v1`` backfill endpoints' own, as the session's principal: ``GET
/v1/jobs/{id}/backfills``, ``POST /v1/jobs/{id}:backfill`` (``dryRun`` answers the count of occurrences that
have no execution yet and the first of them, creating nothing), ``GET /v1/backfills/{id}`` and ``POST
/v1/backfills/{id}/cancel``. The form's "dry run" box is ticked by default, so the count is seen before anything
runs; its answer offers the same range for real behind a confirmation box. A backfill's progress writes no audit
row, so its live region is read on every refresh rather than from the change feed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from pydantic import ValidationError
from starlette.responses import RedirectResponse, Response

from sundial_api import backfills, jobs
from sundial_api.console.answers import answer
from sundial_api.console.guard import ConsoleRoute, Signed, read_form
from sundial_api.console.render import page
from sundial_api.models.backfills import NewBackfill
from sundial_api.problems import ProblemError, describe, field_error, parse_resource_id
from sundial_api.state import State

router = APIRouter(prefix="/ui", route_class=ConsoleRoute, include_in_schema=False)

ResourceId = Annotated[str, Path(max_length=64)]
OVERLAP_POLICIES = ("ALLOW", "BUFFER_ONE")


def _defaults() -> dict[str, str]:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    return {
        "from": (now - timedelta(days=1)).isoformat().replace("+00:00", "Z"),
        "to": now.isoformat().replace("+00:00", "Z"),
        "ratePerSec": "10",
        "overlapPolicy": "ALLOW",
        "dryRun": "yes",
    }


def backfill_body(form: Mapping[str, str]) -> dict[str, Any]:
    """The ``POST /v1/jobs/{id}:backfill`` body the form describes (the model names what is wrong with it)."""
    body: dict[str, Any] = {name: form.get(name, "").strip() for name in ("from", "to", "overlapPolicy")}
    body["ratePerSec"] = form.get("ratePerSec", "").strip() or "10"
    body["dryRun"] = form.get("dryRun") == "yes"
    return body


async def _job_page(
    request: Request,
    state: State,
    session: Signed,
    job_id: str,
    values: Mapping[str, str],
    errors: Sequence[Mapping[str, str]] = (),
    dry_run: Any = None,
    status_code: int = 200,
) -> Response:
    job = await answer(jobs.get_job(job_id, state, session.principal))
    listing = await answer(backfills.list_job_backfills(job_id, state, session.principal, limit=50, cursor=None))
    context = {"job": job, "backfills": listing["items"], "values": values, "errors": list(errors),
               "dry_run": dry_run, "policies": OVERLAP_POLICIES}  # fmt: skip
    return page(request, "backfills.html", context, status_code=status_code, live="backfills_live.html")


@router.get("/jobs/{job_id}/backfills")
async def job_backfills_page(request: Request, state: State, session: Signed, job_id: ResourceId) -> Response:
    return await _job_page(request, state, session, job_id, _defaults())


@router.post("/jobs/{job_id}/backfills")
async def start_backfill(request: Request, state: State, session: Signed, job_id: ResourceId) -> Response:
    form = await read_form(request)
    values = {k: v for k, v in form.items() if k not in ("csrf", "confirm")}
    try:
        model = NewBackfill.model_validate(backfill_body(form))
    except ValidationError as exc:
        errors = [describe({**e, "loc": ("body", *e["loc"])}, NewBackfill) for e in exc.errors()]
        return await _job_page(request, state, session, job_id, values, errors, status_code=422)
    if not model.dry_run and form.get("confirm") != "yes":
        problem = [field_error("confirm", "tick the box to run the backfill (or send a dry run first)")]
        return await _job_page(request, state, session, job_id, values, problem, status_code=422)
    try:
        answered = await answer(backfills.backfill_job(job_id, model, state, session.principal))
    except ProblemError as exc:
        if exc.status >= 500 or exc.status == 404:
            raise
        problems = exc.errors or [field_error("", exc.detail)]
        return await _job_page(request, state, session, job_id, values, problems, status_code=exc.status)
    if model.dry_run:
        return await _job_page(request, state, session, job_id, {**values, "dryRun": ""}, dry_run=answered)
    return RedirectResponse(f"/ui/backfills/{answered['backfillId']}?notice=backfill-started", status_code=303)


@router.get("/backfills/{backfill_id}")
async def backfill_page(request: Request, state: State, session: Signed, backfill_id: ResourceId) -> Response:
    backfill = await answer(backfills.get_backfill(backfill_id, state, session.principal))
    job = await answer(jobs.get_job(backfill["jobId"], state, session.principal))
    return page(request, "backfill.html", {"backfill": backfill, "job": job}, live="backfill_live.html")


@router.post("/backfills/{backfill_id}/cancel")
async def cancel(request: Request, state: State, session: Signed, backfill_id: ResourceId) -> Response:
    if (await read_form(request)).get("confirm") != "yes":
        raise ProblemError(422, "tick the confirmation box to cancel a backfill", errors=[field_error("confirm",
                           "is required")])  # fmt: skip
    await backfills.cancel_backfill(backfill_id, state, session.principal)
    target = f"/ui/backfills/{parse_resource_id('backfill', backfill_id)}?notice=cancelled"
    return RedirectResponse(target, status_code=303)
