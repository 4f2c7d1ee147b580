"""The console's "edit job" form: the new-job form's fields, filled from the job, saved by ``PATCH /v1/jobs/{id}``.

The form sends back every field; only those that differ from the job as it was shown become the patch, so an
untouched schedule is not recomputed. The patch goes through ``jobs.update_job`` as the session's principal
with ``If-Match`` set to the version the form was opened on: the same validation as the API (the job as changed
is checked like a new one), the same audit row (``update``, with what changed), and a change made meanwhile by
someone else is refused (412) instead of overwritten. Problems show the form again with each field's problem.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Path, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.responses import RedirectResponse, Response

from sundial_api import jobs
from sundial_api.console.answers import answer
from sundial_api.console.guard import ConsoleRoute, Signed, read_form
from sundial_api.console.job_form import TYPES, job_body
from sundial_api.console.render import page
from sundial_api.models.jobs import JobCreate, JobPatch
from sundial_api.problems import ProblemError, describe, field_error, invalid, parse_resource_id
from sundial_api.state import State

router = APIRouter(prefix="/ui/jobs", route_class=ConsoleRoute, include_in_schema=False)

JobId = Annotated[str, Path(max_length=64)]


def form_values(job: Mapping[str, Any]) -> dict[str, str]:
    """The edit form's fields as the job fills them (the text the new-job form would have been given)."""

    def text(value: Any) -> str:
        return "" if value is None else str(value)

    return {
        "name": job["name"],
        "type": job["type"],
        "schedule": text(job.get("schedule")),
        "timezone": text(job.get("timezone")),
        "intervalSec": text(job.get("intervalSec")),
        "delaySeconds": text(job.get("delaySeconds")),
        "runAt": text(job.get("runAt")),
        "pool": job["target"]["pool"],
        "handler": job["target"]["handler"],
        "maxAttempts": text((job.get("retryPolicy") or {}).get("maxAttempts")),
        "payload": orjson.dumps(job.get("payload"), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode(),
    }


def changes(
    job: Mapping[str, Any], shown: Mapping[str, str], sent: Mapping[str, str]
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """The ``PATCH`` body of what ``sent`` changed from the form as ``shown``, and the problems reading it."""
    before, _ = job_body(dict(shown))
    after, errors = job_body(dict(sent))
    patch: dict[str, Any] = {}
    for name in sorted(before.keys() | after.keys()):
        if before.get(name) == after.get(name):
            continue
        if name == "retryPolicy":  # the form edits only the attempts: the rest of the policy stays
            attempts = (after.get(name) or {}).get("maxAttempts")
            policy = {k: v for k, v in (job.get("retryPolicy") or {}).items() if k != "maxAttempts"}
            patch[name] = {**policy, "maxAttempts": attempts} if attempts is not None else policy or None
        else:
            patch[name] = after.get(name)  # None: cleared, as the API takes `null`
    return patch, errors


def _form(
    request: Request,
    job: Mapping[str, Any],
    values: Mapping[str, str],
    errors: Sequence[Mapping[str, str]],
    status_code: int,
    version: str,
) -> Response:
    types = TYPES if job["type"] in TYPES else (*TYPES, job["type"])
    context = {"job": job, "values": values, "errors": list(errors), "types": types, "version": version,
               "stale": status_code == 412}  # fmt: skip
    return page(request, "job_edit.html", context, status_code=status_code)


@router.get("/{job_id}/edit")
async def edit_job_page(request: Request, state: State, session: Signed, job_id: JobId) -> Response:
    job = await answer(jobs.get_job(job_id, state, session.principal))
    return _form(request, job, form_values(job), [], 200, str(job["version"]))


@router.post("/{job_id}/edit")
async def edit_job(request: Request, state: State, session: Signed, job_id: JobId) -> Response:
    form = await read_form(request)
    job = await answer(jobs.get_job(job_id, state, session.principal))  # another tenant's: 404 before all else
    version = form.get("version", "")
    if not version.isdigit():
        raise invalid("version", "is the job's version the form was opened on (a whole number)")
    values = {k: v for k, v in form.items() if k not in ("csrf", "version")}
    patch, errors = changes(job, form_values(job), values)
    if errors:
        return _form(request, job, values, errors, 422, version)
    if not patch:
        return RedirectResponse(f"/ui/jobs/{parse_resource_id('job', job_id)}?notice=unchanged", status_code=303)
    try:
        body = JobPatch.model_validate(patch)
        await jobs.update_job(job_id, body, state, session.principal, if_match=f'"{version}"')
    except ValidationError as exc:
        described = [describe({**e, "loc": ("body", *e["loc"])}, JobPatch) for e in exc.errors()]
        return _form(request, job, values, described, 422, version)
    except RequestValidationError as exc:  # the job as changed, checked like a new one
        return _form(request, job, values, [describe(e, JobCreate) for e in exc.errors()], 422, version)
    except ProblemError as exc:
        if exc.status >= 500:
            raise
        return _form(request, job, values, exc.errors or [field_error("", exc.detail)], exc.status, version)
    return RedirectResponse(f"/ui/jobs/{parse_resource_id('job', job_id)}?notice=edited", status_code=303)
