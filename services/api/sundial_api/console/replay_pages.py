"""The console's replays: list them, start one (a dry run first, then the real one with its count), follow its
progress live, cancel it.

Reads and actions are ``/v1/replays``' own endpoints as the session's principal (a tenant sees its own replays,
an admin all). A dry run scans the window and counts what it would publish without publishing; its page then
offers to run the same replay for real, so the count is seen before anything is re-published. A replay's
progress writes no audit row, so its live regions are read on every refresh rather than from the change feed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from pydantic import ValidationError
from starlette.responses import RedirectResponse, Response

from sundial_api import replays
from sundial_api.console.answers import answer
from sundial_api.console.guard import ConsoleRoute, Signed, read_form
from sundial_api.console.render import page
from sundial_api.models.replays import NewReplay
from sundial_api.problems import ProblemError, describe, field_error, parse_resource_id
from sundial_api.state import State

router = APIRouter(prefix="/ui/replays", route_class=ConsoleRoute, include_in_schema=False)

ReplayId = Annotated[str, Path(max_length=64)]


def _defaults() -> dict[str, str]:
    now = datetime.now(UTC).replace(microsecond=0)
    return {
        "sourcePool": "demo",
        "targetPool": "staging-demo",
        "from": (now - timedelta(hours=1)).isoformat().replace("+00:00", "Z"),
        "to": now.isoformat().replace("+00:00", "Z"),
        "handler": "",
        "dryRun": "yes",
    }


def replay_body(form: Mapping[str, str]) -> dict[str, Any]:
    """The ``POST /v1/replays`` body the form describes."""
    body: dict[str, Any] = {name: form.get(name, "").strip() for name in ("sourcePool", "targetPool", "from", "to")}
    handler = form.get("handler", "").strip()
    body["filter"] = {"handler": handler} if handler else {}
    body["dryRun"] = form.get("dryRun") == "yes"
    return body


def _list_page(
    request: Request, listing: Any, values: Mapping[str, str], errors: Sequence[Mapping[str, str]], status_code: int
) -> Response:
    context = {"replays": listing["items"], "values": values, "errors": list(errors)}
    return page(request, "replays.html", context, status_code=status_code, live="replays_live.html")


async def _listing(request: Request, state: State, session: Signed) -> Any:
    return await answer(replays.list_replays(state, session.principal, limit=50, cursor=None))


@router.get("")
async def replays_page(request: Request, state: State, session: Signed) -> Response:
    return _list_page(request, await _listing(request, state, session), _defaults(), [], 200)


@router.post("")
async def start_replay(request: Request, state: State, session: Signed) -> Response:
    form = await read_form(request)
    values = {k: v for k, v in form.items() if k != "csrf"}
    try:
        model = NewReplay.model_validate(replay_body(form))
    except ValidationError as exc:
        errors = [describe({**e, "loc": ("body", *e["loc"])}, NewReplay) for e in exc.errors()]
        return _list_page(request, await _listing(request, state, session), values, errors, 422)
    try:
        created = await answer(replays.create_replay(model, request, state, session.principal, None))
    except ProblemError as exc:
        if exc.status >= 500:
            raise
        problems = exc.errors or [field_error("", exc.detail)]
        return _list_page(request, await _listing(request, state, session), values, problems, exc.status)
    return RedirectResponse(f"/ui/replays/{created['replayId']}", status_code=303)


@router.get("/{replay_id}")
async def replay_page(request: Request, state: State, session: Signed, replay_id: ReplayId) -> Response:
    replay = await answer(replays.get_replay(replay_id, state, session.principal))
    return page(request, "replay.html", {"replay": replay}, live="replay_live.html")


@router.post("/{replay_id}/cancel")
async def cancel(state: State, session: Signed, replay_id: ReplayId) -> Response:
    await replays.cancel_replay(replay_id, state, session.principal)
    return RedirectResponse(f"/ui/replays/{parse_resource_id('replay', replay_id)}?notice=cancelled", status_code=303)
