"""``POST /v1/jobs/{id}:backfill``, ``GET /v1/jobs/{id}/backfills``, ``GET /v1/backfills/{id}``,
``POST /v1/backfills/{id}/cancel``.

A backfill runs a recurring job's occurrences whose nominal times fall in a past range ``[from, to)`` and that
have no execution yet. The API only checks the range and counts what is missing (a dry run stops there);
the executions are created by the leader of the job's shard, under its fence, at the requested rate
(:mod:`sundial_dispatcher.backfills`), as a durable operation that survives a leader's crash.

The range is refused (422 naming the field, nothing written) when it is empty or reversed, reaches into the
future, starts before the job's ``startAt`` or before the executions Postgres keeps
(``SUNDIAL_EXECUTION_RETENTION_DAYS``: an occurrence whose execution was deleted would run a second time), or
holds more than :data:`~sundial_api.models.backfills.MAX_BACKFILL` occurrences.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Path, Query
from starlette.responses import Response
from sundial_common.domain import ids
from sundial_common.domain.schedules import occurrences, spec_from_row
from sundial_common.observability import tracing
from sundial_common.stores.backfills import NewBackfill as BackfillRow

from sundial_api.auth import Authenticated
from sundial_api.json_body import JsonRoute
from sundial_api.models.backfills import (
    DRY_RUN_LISTED,
    MAX_BACKFILL,
    Backfill,
    BackfillList,
    DryRun,
    NewBackfill,
    render_backfill,
)
from sundial_api.models.jobs import JobState
from sundial_api.models.schedules import RECURRING_TYPES
from sundial_api.operations import cancelled, existing, page_of, page_start
from sundial_api.pools import usable_pool
from sundial_api.problems import ProblemError, invalid, not_found, parse_resource_id, responses
from sundial_api.responses import OrjsonResponse
from sundial_api.state import State

router = APIRouter(prefix="/v1", tags=["backfills"], route_class=JsonRoute)

_BEFORE = timedelta(microseconds=1)


def _iso(instant: datetime) -> str:
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


@router.post(
    "/jobs/{job_id}:backfill",
    status_code=202,
    response_model=Backfill,
    responses={
        **responses(401, 403, 404, 409, 422, 503),
        200: {"model": DryRun, "description": "`dryRun`: the count."},
    },
    summary="Run a recurring job's past occurrences that have no execution yet",
    response_description="The backfill, accepted; `Location` points at it (`GET` it for its progress).",
)
async def backfill_job(
    job_id: Annotated[str, Path(description="The recurring job's id.")],
    body: NewBackfill,
    state: State,
    principal: Authenticated,
) -> Response:
    """Occurrences of `[from, to)` without an execution run at `ratePerSec` (never a second execution for a
    nominal time that has one). With `dryRun`, 200 with the count and the first nominal times, nothing created."""
    ident = parse_resource_id("job", job_id)
    job = await state.stores.jobs.get_job(principal.tenant, ident)
    if job is None:
        raise not_found("job", job_id)
    if job["type"] not in RECURRING_TYPES:
        raise invalid("jobId", f"is a {job['type']} job: only CRON, INTERVAL and RUN_LIST jobs have past occurrences")
    if job["state"] == JobState.CANCELLED:
        raise ProblemError(409, f"job {job_id} is CANCELLED: it runs nothing more")
    # The pool may have been closed to this tenant since the job was created.
    await usable_pool(state, principal.tenant, job["pool"], "target.pool", job_id=ident)
    start, end = body.range_from, body.range_to
    now = state.clock.now()
    if end <= start:
        raise invalid("to", f"must be after `from` ({_iso(start)})")
    if end > now:
        raise invalid("to", f"is in the future ({_iso(end)}); a backfill runs past occurrences only")
    if job["start_at"] is not None and start < job["start_at"]:
        raise invalid("from", f"is before the job's startAt ({_iso(job['start_at'])})")
    retention = state.settings.execution_retention_days
    if retention > 0 and start < now - timedelta(days=retention):
        raise invalid(
            "from",
            f"is older than the {retention:g} days of executions Postgres keeps (SUNDIAL_EXECUTION_RETENTION_DAYS): "
            "an occurrence whose execution was deleted could run twice",
        )
    spec = dataclasses.replace(spec_from_row(job), max_runs=None)  # an explicit range, not the schedule's runs
    nominals: list[datetime] = []
    for nominal in occurrences(spec, start - _BEFORE):
        if nominal >= end:
            break
        nominals.append(nominal)
        if len(nominals) > MAX_BACKFILL:
            raise invalid("to", f"the range holds more than {MAX_BACKFILL} occurrences; backfill it in parts")
    existing = await state.stores.backfills.existing_occurrences(ident, start, end) if nominals else set()
    missing = [n for n in nominals if n not in existing]
    if body.dry_run:
        return OrjsonResponse({"count": len(missing), "first": missing[:DRY_RUN_LISTED]})
    backfill_id = ids.new_id()
    row = await state.stores.backfills.create(
        BackfillRow(
            id=backfill_id,
            tenant_id=principal.tenant,
            job_id=ident,
            shard=job["shard"],
            range_from=start,
            range_to=end,
            overlap_policy=body.overlap_policy.value,
            rate_per_sec=body.rate_per_sec,
            total=len(missing),
            actor=principal.subject,
            traceparent=tracing.traceparent(),
        )
    )
    return OrjsonResponse(render_backfill(row), status_code=202, headers={"Location": f"/v1/backfills/{backfill_id}"})


_CURSOR_PREFIX = "b1"


@router.get(
    "/jobs/{job_id}/backfills",
    response_model=BackfillList,
    responses=responses(401, 404, 422, 503),
    summary="A job's backfills, newest first",
)
async def list_job_backfills(
    job_id: Annotated[str, Path(description="The job's id (a UUID). Unknown, malformed or another tenant's: 404.")],
    state: State,
    principal: Authenticated,
    limit: Annotated[int, Query(ge=1, le=200, description="Page size.")] = 50,
    cursor: Annotated[
        str | None, Query(description="`nextCursor` of the previous page; omit for the first page.")
    ] = None,
) -> Response:
    """Every backfill of the job, with its progress, whatever its state."""
    ident = parse_resource_id("job", job_id)
    before = page_start(_CURSOR_PREFIX, cursor)
    if await state.stores.jobs.get_job(principal.tenant, ident) is None:
        raise not_found("job", job_id)
    # One row more than the page tells whether another page exists without a count query.
    rows = await state.stores.backfills.of_job(principal.tenant, ident, before, limit + 1)
    page, next_cursor = page_of(_CURSOR_PREFIX, rows, limit)
    return OrjsonResponse({"items": [render_backfill(row) for row in page], "nextCursor": next_cursor})


@router.get(
    "/backfills/{backfill_id}",
    response_model=Backfill,
    responses=responses(401, 404, 503),
    summary="A backfill and its progress",
)
async def get_backfill(
    backfill_id: Annotated[str, Path(description="The backfill's id.")], state: State, principal: Authenticated
) -> Response:
    row = await existing("backfill", backfill_id, lambda ident: state.stores.backfills.get(principal.tenant, ident))
    return OrjsonResponse(render_backfill(row))


@router.post(
    "/backfills/{backfill_id}/cancel",
    response_model=Backfill,
    responses=responses(401, 404, 409, 503),
    summary="Cancel a backfill: no more executions are created",
)
async def cancel_backfill(
    backfill_id: Annotated[str, Path(description="The backfill's id.")], state: State, principal: Authenticated
) -> Response:
    """RUNNING → CANCELLED; the executions already created run on. Idempotent; a DONE backfill: 409."""
    row = await cancelled(
        "backfill",
        backfill_id,
        lambda ident: state.stores.backfills.cancel(principal.tenant, ident, actor=principal.subject),
        lambda ident: state.stores.backfills.get(principal.tenant, ident),
        "nothing left to cancel",
        again="CANCELLED",
    )
    return OrjsonResponse(render_backfill(row))
