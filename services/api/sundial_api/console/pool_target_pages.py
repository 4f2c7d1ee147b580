"""The console's view of HTTP pools' targets: on the pools page, each pool's delivery (``worker`` or ``http``) and,
for an HTTP pool the tenant owns, where its executions are POSTed; and the owner's form that sets the URL.

Reading is ``GET /v1/pools/{name}/target`` and setting is ``PUT /v1/pools/{name}/target``, the endpoints' own
functions as the session's principal (:mod:`~sundial_api.pool_targets`): the same ownership rule, the same URL
check (a 422 naming ``url``), the same sealed secret. A new secret is shown once, on the page answering the form;
the form keeps the target's per-handler paths as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from pydantic import ValidationError
from starlette.responses import Response
from sundial_common.security.auth import Principal

from sundial_api import pool_targets
from sundial_api.console.answers import answer
from sundial_api.console.guard import ConsoleRoute, Signed, read_form
from sundial_api.console.render import page
from sundial_api.models.targets import TargetPut
from sundial_api.problems import ProblemError, describe, field_error
from sundial_api.state import ApiState, State

router = APIRouter(prefix="/ui/pools", route_class=ConsoleRoute, include_in_schema=False)

PoolName = Annotated[str, Path(max_length=63)]


async def target_of(state: ApiState, principal: Principal, name: str) -> dict[str, Any] | None:
    """The pool's target as ``GET /v1/pools/{name}/target`` answers it, or None when it has none yet."""
    try:
        found: dict[str, Any] = await answer(pool_targets.get_target(name, state, principal))
    except ProblemError as exc:
        if exc.status == 404:
            return None
        raise
    return found


async def with_targets(state: ApiState, principal: Principal, listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each pool of ``listed`` with its ``target`` (None when it is not an HTTP pool the tenant owns, or has none)
    and whether the session may set it (``manages``)."""
    shown = []
    for p in listed:
        manages = p.get("delivery") == "http" and p.get("owner") == principal.tenant
        target = await target_of(state, principal, p["name"]) if manages else None
        shown.append({**p, "target": target, "manages": manages})
    return shown


@router.post("/{name}/target")
async def set_target(request: Request, state: State, session: Signed, name: PoolName) -> Response:
    """Set the pool's base URL (its paths kept); answered by the target page showing the secret if it is new."""
    form = await read_form(request)
    principal = session.principal
    url = form.get("url", "").strip()
    current = await target_of(state, principal, name)
    errors: Sequence[Mapping[str, str]] = []
    target: dict[str, Any] | None = None
    status = 200
    try:
        body = TargetPut.model_validate({"url": url, "paths": (current or {}).get("paths") or None})
        target = await answer(pool_targets.put_target(name, body, state, principal))
    except ValidationError as exc:
        errors = [describe({**e, "loc": ("body", *e["loc"])}, TargetPut) for e in exc.errors()]
        status = 422
    except ProblemError as exc:
        if exc.status >= 500:
            raise
        errors, status = exc.errors or [field_error("", exc.detail)], exc.status
    # The answer holds the secret in full only when it is new (the first target, or a new owner's).
    new = target is not None and (current is None or target["secret"] != current["secret"])
    context = {"pool": name, "target": target or current, "new": new, "errors": errors, "url": url}
    return page(request, "pool_target.html", context, status_code=status)
