"""The console's job pages: the jobs list, one job, and the job actions (trigger, pause, resume, delete).

Every read and every action is the ``/v1`` endpoint's own (:mod:`sundial_api.console.answers`), run as the
session's principal; an action is a plain form POST answered by a redirect to the page it came from
(post/redirect/get), so it works with JavaScript off, and writes the audit row the API writes.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, TypeVar
from urllib.parse import urlencode

from fastapi import APIRouter, Path, Query, Request
from starlette.responses import RedirectResponse, Response
from sundial_common.stores.jobs import JobFilter

from sundial_api import audit, job_list, job_preview, jobs
from sundial_api.console import job_order
from sundial_api.console.answers import answer
from sundial_api.console.counts import StateCounts
from sundial_api.console.guard import ConsoleRoute, Signed, read_form
from sundial_api.console.live import skip_unchanged
from sundial_api.console.render import page
from sundial_api.models.jobs import JobState
from sundial_api.models.schedules import JobType
from sundial_api.problems import ProblemError, field_error, invalid, parse_resource_id
from sundial_api.state import ApiState, State

router = APIRouter(prefix="/ui/jobs", route_class=ConsoleRoute, include_in_schema=False)

PAGE_SIZE = 50
#: The orders the jobs list offers, by the value of its ``sort`` parameter.
SORTS = {"created": "Newest first", "next-fire": "Next fire, soonest first"}
#: Where the list's times are shown, by the value of its ``tz`` parameter (``local``: the browser's zone, set by
#: the page's script; UTC without JavaScript).
ZONES = {"utc": "UTC", "local": "My browser's zone", "job": "Each job's zone"}
JOB_STATES = [s.value for s in JobState]
JOB_TYPES = [t.value for t in JobType]

JobId = Annotated[str, Path(max_length=64)]
Text = Annotated[str, Query(max_length=200)]


Choice = TypeVar("Choice", JobState, JobType)


def _choice(kind: type[Choice], field: str, raw: str) -> Choice | None:
    if not raw:
        return None
    try:
        return kind(raw)
    except ValueError:
        raise invalid(field, f"is not one of {', '.join(kind)}") from None


def _counts(request: Request, state: ApiState) -> StateCounts:
    counts: StateCounts | None = getattr(request.app.state, "console_counts", None)
    if counts is None:
        counts = request.app.state.console_counts = StateCounts(state.stores.jobs)
    return counts


@router.get("")
async def jobs_page(
    request: Request,
    state: State,
    session: Signed,
    q: Text = "",
    job_state: Annotated[str, Query(alias="state", max_length=20)] = "",
    job_type: Annotated[str, Query(alias="type", max_length=20)] = "",
    pool: Annotated[str, Query(max_length=63)] = "",
    handler: Annotated[str, Query(max_length=128)] = "",
    label: Annotated[str, Query(max_length=200, description="`key:value`")] = "",
    cursor: Annotated[str, Query(max_length=200)] = "",
    sort: Annotated[str, Query(max_length=20, description="`created` (newest first) or `next-fire`")] = "created",
    tz: Annotated[str, Query(max_length=10, description="`utc`, `local` (the browser's) or `job`")] = "utc",
) -> Response:
    if sort not in SORTS:
        raise invalid("sort", f"is not one of {', '.join(SORTS)}")
    if tz not in ZONES:
        raise invalid("tz", f"is not one of {', '.join(ZONES)}")
    skip_unchanged(request, state, session)
    principal = session.principal
    chosen_state, chosen_type = _choice(JobState, "state", job_state), _choice(JobType, "type", job_type)
    if sort == "next-fire":
        where = JobFilter(
            state=chosen_state.value if chosen_state else None,
            type=chosen_type.value if chosen_type else None,
            pool=pool or None,
            handler=handler or None,
            name_prefix=q or None,
            labels=job_order.label_filter(label),
        )
        reading = job_order.by_next_fire(state, principal, where, cursor or None, PAGE_SIZE)
    else:
        reading = answer(
            job_list.list_jobs_route(
                state,
                principal,
                job_state=chosen_state,
                job_type=chosen_type,
                pool=pool or None,
                handler=handler or None,
                name_prefix=q or None,
                label=[label] if label else None,
                created_from=None,
                created_to=None,
                next_fire_from=None,
                next_fire_to=None,
                limit=PAGE_SIZE,
                cursor=cursor or None,
            )
        )
    listing, counts = await asyncio.gather(
        reading, _counts(request, state).of(principal.tenant, state.changes.version(principal.tenant))
    )
    filters = {"q": q, "state": job_state, "type": job_type, "pool": pool, "handler": handler, "label": label,
               "sort": sort, "tz": tz}  # fmt: skip
    return page(
        request,
        "jobs.html",
        {
            "jobs": listing["items"],
            "next_cursor": listing["nextCursor"],
            "paged": bool(cursor),
            "filters": filters,
            "query": urlencode(filters),
            "sorts": SORTS,
            "zones": ZONES,
            "counts": counts,
            "total": sum(counts.values()),
            "job_states": JOB_STATES,
            "job_types": JOB_TYPES,
        },
        live="jobs_live.html",
    )


@router.get("/{job_id}")
async def job_page(request: Request, state: State, session: Signed, job_id: JobId) -> Response:
    skip_unchanged(request, state, session)
    principal = session.principal
    job = await answer(jobs.get_job(job_id, state, principal))
    executions, fires, trail = await asyncio.gather(
        answer(jobs.list_executions(job_id, state, principal, limit=20, cursor=None)),
        answer(job_preview.preview_job(job_id, state, principal, count=10)),
        answer(audit.job_audit(job_id, state, principal, action=None, limit=100, cursor=None)),
    )
    return page(
        request,
        "job.html",
        {"job": job, "executions": executions["items"], "fires": fires, "audit": trail["items"]},
        live="job_live.html",
    )


def _back(job_id: str, notice: str) -> Response:
    return RedirectResponse(f"/ui/jobs/{parse_resource_id('job', job_id)}?notice={notice}", status_code=303)


@router.post("/{job_id}/trigger")
async def trigger(state: State, session: Signed, job_id: JobId) -> Response:
    await jobs.trigger_job(job_id, state, session.principal)
    return _back(job_id, "triggered")


@router.post("/{job_id}/pause")
async def pause(state: State, session: Signed, job_id: JobId) -> Response:
    await jobs.pause_job(job_id, state, session.principal)
    return _back(job_id, "paused")


@router.post("/{job_id}/resume")
async def resume(state: State, session: Signed, job_id: JobId) -> Response:
    await jobs.resume_job(job_id, state, session.principal)
    return _back(job_id, "resumed")


@router.post("/{job_id}/cancel")
async def cancel(request: Request, state: State, session: Signed, job_id: JobId) -> Response:
    """Delete the job as ``DELETE /v1/jobs/{id}`` does: it is CANCELLED (its history stays), after the form's
    confirmation box is ticked; ``cascade`` also cancels the DEPENDENT jobs that run after it."""
    form = await read_form(request)
    if form.get("confirm") != "yes":
        raise ProblemError(
            422, "tick the confirmation box to delete a job", errors=[field_error("confirm", "is required")]
        )
    await jobs.cancel_job(job_id, state, session.principal, cascade=form.get("cascade") == "yes")
    return _back(job_id, "deleted")
