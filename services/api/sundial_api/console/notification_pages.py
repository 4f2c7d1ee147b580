"""The console's notifications page: the tenant's subscriptions, making and deleting one, a test send, and each
subscription's delivery log.

Every action is the ``/v1/notifications/subscriptions`` endpoint's own function, called as the session's principal
(:mod:`~sundial_api.notifications`): the same checks of the URL or e-mail address, the events and the scope, the
same sealed secret. The secret a new subscription gets is shown once, on the page that answers the create; the
list shows it redacted as the API does. Bad input shows the form again with the API's 422 message by its field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from pydantic import ValidationError
from starlette.responses import RedirectResponse, Response
from sundial_common.security.auth import Principal
from sundial_common.stores.notifications import EVENTS

from sundial_api import notifications
from sundial_api.console.answers import answer
from sundial_api.console.guard import ConsoleRoute, Signed, read_form
from sundial_api.console.render import page
from sundial_api.models.notifications import SubscriptionCreate
from sundial_api.problems import ProblemError, describe, field_error, parse_resource_id
from sundial_api.state import ApiState, State

router = APIRouter(prefix="/ui/notifications", route_class=ConsoleRoute, include_in_schema=False)

SubscriptionId = Annotated[str, Path(max_length=64)]
#: The form's text fields, by the body field they fill.
TEXT_FIELDS = {"url": "url", "email": "email", "pool": "pool", "jobId": "jobId", "description": "description"}
#: The prefix of the events' checkboxes (``event:execution.dead=yes``): one form field per event.
EVENT_PREFIX = "event:"


def subscription_body(form: Mapping[str, str]) -> dict[str, Any]:
    """The ``POST /v1/notifications/subscriptions`` body the form describes (empty fields left out)."""
    body: dict[str, Any] = {}
    for name, field in TEXT_FIELDS.items():
        value = form.get(name, "").strip()
        if value:
            body[field] = value
    body["events"] = [event for event in EVENTS if form.get(EVENT_PREFIX + event) == "yes"]
    return body


async def _list_page(
    request: Request,
    state: ApiState,
    principal: Principal,
    *,
    values: Mapping[str, str],
    errors: Sequence[Mapping[str, str]] = (),
    created: Mapping[str, Any] | None = None,
    status_code: int = 200,
) -> Response:
    listed = await answer(notifications.list_subscriptions(state, principal))
    context = {
        "subscriptions": listed["items"],
        "events": EVENTS,
        "values": values,
        "errors": errors,
        "created": created,
    }
    return page(request, "notifications.html", context, status_code=status_code)


@router.get("")
async def notifications_page(request: Request, state: State, session: Signed) -> Response:
    return await _list_page(request, state, session.principal, values={EVENT_PREFIX + "execution.dead": "yes"})


@router.post("")
async def create(request: Request, state: State, session: Signed) -> Response:
    form = await read_form(request)
    values = {k: v for k, v in form.items() if k != "csrf"}
    body = subscription_body(form)
    try:
        model = SubscriptionCreate.model_validate(body)
    except ValidationError as exc:
        errors: Sequence[Mapping[str, str]] = [
            describe({**e, "loc": ("body", *e["loc"])}, SubscriptionCreate) for e in exc.errors()
        ]
        return await _list_page(request, state, session.principal, values=values, errors=errors, status_code=422)
    try:
        created = await answer(notifications.create_subscription(model, state, session.principal))
    except ProblemError as exc:
        if exc.status >= 500:
            raise
        errors = exc.errors or [field_error("", exc.detail)]
        return await _list_page(request, state, session.principal, values=values, errors=errors, status_code=exc.status)
    return await _list_page(request, state, session.principal, values={}, created=created)


@router.get("/{subscription_id}")
async def subscription_page(
    request: Request, state: State, session: Signed, subscription_id: SubscriptionId
) -> Response:
    subscription = await answer(notifications.get_subscription(subscription_id, state, session.principal))
    log = await answer(notifications.delivery_log(subscription_id, state, session.principal, limit=50))
    sent = request.query_params.get("sent")
    context = {"sub": subscription, "deliveries": log["items"], "sent": sent if sent in ("ok", "failed") else None}
    return page(request, "notification.html", context)


@router.post("/{subscription_id}/test")
async def test_send(state: State, session: Signed, subscription_id: SubscriptionId) -> Response:
    sent = await answer(notifications.test_send(subscription_id, state, session.principal))
    ident = parse_resource_id(notifications.KIND, subscription_id)
    outcome = "ok" if sent["delivered"] else "failed"
    return RedirectResponse(f"/ui/notifications/{ident}?sent={outcome}", status_code=303)


@router.post("/{subscription_id}/delete")
async def delete(state: State, session: Signed, subscription_id: SubscriptionId) -> Response:
    await notifications.delete_subscription(subscription_id, state, session.principal)
    return RedirectResponse("/ui/notifications?notice=subscription-deleted", status_code=303)
