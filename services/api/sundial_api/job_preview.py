"""Previews of fires: a job's next fires (``GET /v1/jobs/{id}/preview``) and a schedule's, without a job
(``POST /v1/schedules:preview``) — computed as the dispatcher computes them, jitter and time zone included."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Path, Query
from starlette.responses import Response
from sundial_common.domain.schedules import ScheduleSpec, fire_at, local_time, preview, spec_from_row

from sundial_api.auth import Authenticated
from sundial_api.job_definition import resolve
from sundial_api.json_body import JsonRoute
from sundial_api.models.jobs import JobState
from sundial_api.models.schedules import MAX_PREVIEW, Preview, SchedulePreviewRequest
from sundial_api.problems import not_found, parse_resource_id, responses
from sundial_api.responses import OrjsonResponse
from sundial_api.state import State

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=JsonRoute)
schedules_router = APIRouter(prefix="/v1", tags=["jobs"], route_class=JsonRoute)

JobId = Annotated[str, Path(description="The job's id (a UUID). Unknown, malformed or another tenant's: 404.")]


def _fires(spec: ScheduleSpec, first: datetime | None, count: int, runs: int, job_id: UUID | None) -> dict[str, Any]:
    nominals = [] if first is None else [first, *preview(spec, first, count - 1, runs + 1)]
    return {
        "timezone": spec.timezone,
        "fires": [
            {
                "scheduledFor": n,
                "fireAt": fire_at(job_id, n, spec.jitter_sec) if job_id is not None else n,
                "local": local_time(n, spec.timezone).isoformat(),
            }
            for n in nominals
        ],
    }


@router.get(
    "/{job_id}/preview",
    response_model=Preview,
    responses=responses(401, 404, 422, 503),
    summary="The next fires of a job",
)
async def preview_job(
    job_id: JobId,
    state: State,
    principal: Authenticated,
    count: Annotated[int, Query(ge=1, le=MAX_PREVIEW, description="How many fires to list.")] = 10,
) -> Response:
    """The job's next `count` fires — nominal and with jitter, in UTC and on the wall clock of its zone — as
    the dispatcher will compute them. A paused job lists those after now (resuming may add catch-up runs);
    a completed or cancelled one, none.
    """
    ident = parse_resource_id("job", job_id)
    job = await state.stores.jobs.get_job(principal.tenant, ident)
    if job is None:
        raise not_found("job", job_id)
    spec = spec_from_row(job)
    runs = job["fire_count"]
    first: datetime | None = None
    if job["state"] == JobState.ACTIVE:
        first = job["next_nominal_at"] or job["next_fire_at"]
    elif job["state"] == JobState.PAUSED and job["next_fire_at"] is not None:
        upcoming = preview(spec, state.clock.now(), 1, runs)
        first = upcoming[0] if upcoming else None
    return OrjsonResponse(_fires(spec, first, count, runs, ident))


@schedules_router.post(
    "/schedules:preview",
    response_model=Preview,
    responses=responses(401, 422, 503),
    summary="Try a schedule: its next fires, without creating a job",
)
async def preview_schedule(body: SchedulePreviewRequest, state: State, principal: Authenticated) -> Response:
    """The next `count` fires of the schedule in the body (a job body's schedule fields), in UTC and on the
    wall clock of its zone. Validated as a job would be: an invalid schedule is a 422 naming the field.
    """
    resolved = resolve(body, state, state.clock.now())
    return OrjsonResponse(_fires(resolved.spec, resolved.next_nominal, body.count, 0, None))
