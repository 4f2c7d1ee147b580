"""E-mail subscriptions' addresses, confirmed before use: the link sent at creation, and the page it opens.

An e-mail subscription names an address, not a URL, and anyone may type anyone's address: so the address is
sent one message at creation, a link holding a random token, and the subscription delivers nothing until someone
with that mailbox follows it (``GET /v1/notifications/confirm?token=…``, no sign-in: the token is the proof). Only
the token's SHA-256 is stored. Until then each of its deliveries ends FAILED at once, saying why, in its delivery
log, and ``GET`` of the subscription answers ``emailConfirmed: false``. The messages themselves go through the
deployment's SMTP relay (:mod:`sundial_common.delivery.mail`).
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Annotated

from fastapi import APIRouter, Query
from starlette.responses import HTMLResponse, Response
from sundial_common.delivery.mail import bad_address, send_mail
from sundial_common.delivery.sender import Outcome

from sundial_api.json_body import JsonRoute
from sundial_api.notification_delivery import MAILTO
from sundial_api.problems import ProblemError, invalid, responses
from sundial_api.state import ApiState, State

router = APIRouter(prefix="/v1/notifications", tags=["notifications"], route_class=JsonRoute)


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def new_token() -> tuple[str, bytes]:
    """A confirmation token and the digest that is stored of it."""
    token = secrets.token_urlsafe(32)
    return token, digest(token)


def email_destination(state: ApiState, address: str) -> str:
    """The subscription's ``url`` for ``address``, or a 422 naming ``email``."""
    problem = bad_address(address)
    if problem is not None:
        raise invalid("email", problem)
    if state.notifications.mail is None:
        raise invalid("email", "this deployment has no SMTP relay (SUNDIAL_SMTP_HOST): e-mail cannot be sent")
    return MAILTO + address


async def send_confirmation(state: ApiState, address: str, token: str, subscription_id: str) -> Outcome:
    """Send ``address`` its confirmation link."""
    relay = state.notifications.mail
    assert relay is not None  # email_destination checked it
    link = f"{state.settings.public_url.rstrip('/')}/v1/notifications/confirm?token={token}"
    body = (
        f"Someone subscribed {address} to notifications of Sundial (subscription {subscription_id}).\n\n"
        f"Follow this link to receive them:\n\n  {link}\n\n"
        "If you did not expect this, ignore this message: nothing will be sent to you.\n"
    )
    return await send_mail(
        relay, address, "[Sundial] Confirm your address for notifications", body, f"confirm_{subscription_id}"
    )


@router.get(
    "/confirm",
    response_class=HTMLResponse,
    include_in_schema=False,  # a link in an e-mail, for a browser: not an operation of the API's clients
    responses=responses(404, 422, 503),
    summary="Confirm an e-mail subscription's address (the link sent to it; no sign-in, the token is the proof)",
)
async def confirm_email(
    state: State,
    token: Annotated[str, Query(min_length=20, max_length=100, description="The token of the link sent.")],
) -> Response:
    row = await state.stores.notifications.confirm_email(digest(token))
    if row is None:
        raise ProblemError(404, "no subscription waits for this link (it was deleted, or the link is not whole)")
    address = row["url"].removeprefix(MAILTO)
    return HTMLResponse(
        f"<!doctype html><title>Sundial</title><p>{_escape(address)} is confirmed: notifications of subscription "
        f"{row['id']} will be sent to it.</p>"
    )


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
