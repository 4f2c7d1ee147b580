"""The console's "new job" form: the fields of a ``POST /v1/jobs`` body, created by that endpoint itself.

The form's fields become a job body (camelCase, as ``/v1`` takes it), validated by the API's own model and
created by ``jobs.create_job`` as the session's principal: the same checks (pool admitted to the tenant,
quotas, schedule), the same audit row. Invalid input shows the form again with each field's problem (422).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.responses import RedirectResponse, Response

from sundial_api import jobs
from sundial_api.console.answers import answer
from sundial_api.console.guard import ConsoleRoute, Signed, read_form
from sundial_api.console.render import page
from sundial_api.models.jobs import JobCreate
from sundial_api.problems import ProblemError, describe, field_error
from sundial_api.state import State

router = APIRouter(prefix="/ui/jobs", route_class=ConsoleRoute, include_in_schema=False)

TYPES = ("CRON", "INTERVAL", "DELAYED", "ONE_SHOT")
#: Form fields taken as text, by the body field they fill.
TEXT_FIELDS = {"name": "name", "type": "type", "schedule": "schedule", "timezone": "timezone", "runAt": "runAt"}
#: Form fields taken as whole numbers.
NUMBER_FIELDS = ("intervalSec", "delaySeconds")
DEFAULTS = {"type": "CRON", "timezone": "UTC", "pool": "demo", "handler": "echo", "payload": "{}"}


def _number(form: dict[str, str], name: str, errors: list[dict[str, str]]) -> int | None:
    raw = form.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        errors.append(field_error(name, "is not a whole number"))
        return None


def job_body(form: dict[str, str]) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """The ``/v1/jobs`` body the form describes, and the problems found reading it (before the model's)."""
    errors: list[dict[str, str]] = []
    body: dict[str, Any] = {}
    for name, field in TEXT_FIELDS.items():
        value = form.get(name, "").strip()
        if value:
            body[field] = value
    for name in NUMBER_FIELDS:
        number = _number(form, name, errors)
        if number is not None:
            body[name] = number
    body["target"] = {"pool": form.get("pool", "").strip(), "handler": form.get("handler", "").strip()}
    raw_payload = form.get("payload", "").strip()
    if raw_payload:
        try:
            body["payload"] = orjson.loads(raw_payload)
        except orjson.JSONDecodeError as exc:
            errors.append(field_error("payload", f"is not JSON: {exc}"))
    attempts = _number(form, "maxAttempts", errors)
    if attempts is not None:
        body["retryPolicy"] = {"maxAttempts": attempts}
    return body, errors


def _form(request: Request, values: dict[str, str], errors: Sequence[Mapping[str, str]], status_code: int) -> Response:
    return page(request, "job_new.html", {"values": values, "errors": errors, "types": TYPES}, status_code=status_code)


@router.get("/new")
async def new_job_page(request: Request, session: Signed) -> Response:
    return _form(request, dict(DEFAULTS), [], 200)


@router.post("/new")
async def create_job(request: Request, state: State, session: Signed) -> Response:
    form = await read_form(request)
    values = {k: v for k, v in form.items() if k != "csrf"}
    body, errors = job_body(form)
    if errors:
        return _form(request, values, errors, 422)
    try:
        model = JobCreate.model_validate(body)
    except ValidationError as exc:
        described = [describe({**e, "loc": ("body", *e["loc"])}, JobCreate) for e in exc.errors()]
        return _form(request, values, described, 422)
    try:
        created = await answer(jobs.create_job(model, state, session.principal, None))
    except ProblemError as exc:
        if exc.status >= 500:
            raise
        return _form(request, values, exc.errors or [field_error("", exc.detail)], exc.status)
    return RedirectResponse(f"/ui/jobs/{created['jobId']}?notice=created", status_code=303)
