"""``/v1/notifications/subscriptions``: a tenant's webhooks, their delivery log, and a test send.

A subscription names a URL (or an e-mail address: :mod:`sundial_api.notification_email`) and the events to be told
about, for all the tenant's jobs or one pool's or one job's. Its signing secret is made here, returned once in the
answer to the create (or to a rotation) and stored sealed under the tenant's data key; every later answer shows it
redacted. After a rotation each request is signed with the new secret and, for the overlap asked for, the previous
one too. The URL is checked when the subscription is made (an ``https`` URL outside development, whose host resolves
only to addresses requests may reach) and again at every send, since DNS answers change. Incidents are recorded by
the sweeper and delivered by the API replicas (:mod:`sundial_api.notification_delivery`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from starlette.responses import Response
from sundial_client.models.notifications import DeliveryList, SubscriptionList, SubscriptionView, TestSendView
from sundial_common.delivery.address_policy import AddressRefused
from sundial_common.delivery.sender import URLRefused
from sundial_common.delivery.signing import new_secret, redact
from sundial_common.security.encryption import TenantCipher
from sundial_common.stores.notifications import EVENTS, NewSubscription
from sundial_common.stores.types import Record

from sundial_api.auth import Authenticated
from sundial_api.json_body import JsonRoute
from sundial_api.models.notifications import SubscriptionCreate, render_delivery, render_subscription
from sundial_api.notification_delivery import SECRETS
from sundial_api.notification_destinations import allowance_for, allowed_networks
from sundial_api.notification_email import email_destination, new_token, send_confirmation
from sundial_api.problems import ProblemError, invalid, not_found, parse_resource_id, responses
from sundial_api.responses import OrjsonResponse
from sundial_api.state import ApiState, State

router = APIRouter(prefix="/v1/notifications", tags=["notifications"], route_class=JsonRoute)

SubscriptionId = Annotated[str, Path(description="The subscription's id.")]
KIND = "subscription"
#: The longest a previous secret keeps signing after a rotation.
MAX_OVERLAP_SEC = 7 * 86_400


@router.post(
    "/subscriptions",
    response_model=SubscriptionView,
    status_code=201,
    responses=responses(401, 422, 503),
    summary="Subscribe a webhook to events of the tenant's jobs (the answer holds its secret, once)",
)
async def create_subscription(body: SubscriptionCreate, state: State, principal: Authenticated) -> Response:
    unknown = [event for event in body.events if event not in EVENTS]
    if unknown:
        raise invalid("events", f"unknown event {unknown[0]!r}; one of: {', '.join(EVENTS)}")
    if body.pool is not None and body.job_id is not None:
        raise invalid("jobId", "give `pool` or `jobId`, not both (a job is in one pool)")
    if body.job_id is not None and await state.stores.jobs.get_job(principal.tenant, body.job_id) is None:
        raise invalid("jobId", f"no job {body.job_id} in this tenant")
    token: str | None = None
    token_digest: bytes | None = None
    allowance: Record | None = None
    if body.url is not None and body.email is not None:
        raise invalid("email", "give `url` or `email`, not both")
    if body.email is not None:
        destination = email_destination(state, body.email)
        token, token_digest = new_token()
    elif body.url is not None:
        destination = body.url
        allowance = await allowance_for(state, principal.tenant, body.url)
        allowed = allowed_networks(allowance["addresses"]) if allowance is not None else ()
        try:
            await state.notifications.sender.check_destination(body.url, allowed)
        except (URLRefused, AddressRefused) as exc:
            raise invalid("url", str(exc)) from None
    else:
        raise invalid("url", "give a webhook `url` or an `email` address")
    secret = new_secret()
    cipher = await state.keyring.cipher(principal.tenant)
    row = await state.stores.notifications.create_subscription(
        NewSubscription(
            tenant_id=principal.tenant,
            created_by=principal.subject,
            events=tuple(dict.fromkeys(body.events)),
            url=destination,
            sealed_secrets=cipher.seal_json([secret], SECRETS),
            pool=body.pool,
            job_id=body.job_id,
            description=body.description,
            email_token_digest=token_digest,
            allowed_origin=allowance["origin"] if allowance is not None else None,
            allowed_addresses=tuple(allowance["addresses"]) if allowance is not None else None,
        )
    )
    if body.email is not None and token is not None:
        sent = await send_confirmation(state, body.email, token, str(row["id"]))
        if not sent.ok:  # a subscription its address can never confirm is of no use: it goes again
            await state.stores.notifications.delete_subscription(row["id"], principal.tenant)
            raise ProblemError(503, f"the confirmation e-mail was not sent ({sent.error}); nothing was subscribed")
    return OrjsonResponse(render_subscription(row, secret), status_code=201)


@router.get(
    "/subscriptions",
    response_model=SubscriptionList,
    responses=responses(401, 503),
    summary="The tenant's notification subscriptions (secrets redacted)",
)
async def list_subscriptions(state: State, principal: Authenticated) -> Response:
    rows = await state.stores.notifications.list_subscriptions(principal.tenant)
    cipher = await state.keyring.cipher(principal.tenant)
    return OrjsonResponse({"items": [render_subscription(row, _shown(cipher, row)) for row in rows]})


@router.get(
    "/subscriptions/{subscription_id}",
    response_model=SubscriptionView,
    responses=responses(401, 404, 503),
    summary="One notification subscription (its secret redacted)",
)
async def get_subscription(subscription_id: SubscriptionId, state: State, principal: Authenticated) -> Response:
    row = await _get(state, principal.tenant, subscription_id)
    cipher = await state.keyring.cipher(principal.tenant)
    return OrjsonResponse(render_subscription(row, _shown(cipher, row)))


@router.delete(
    "/subscriptions/{subscription_id}",
    status_code=204,
    responses=responses(401, 404, 503),
    summary="Delete a subscription: nothing more is sent to it (deliveries still pending are cancelled)",
)
async def delete_subscription(subscription_id: SubscriptionId, state: State, principal: Authenticated) -> Response:
    ident = parse_resource_id(KIND, subscription_id)
    if not await state.stores.notifications.delete_subscription(ident, principal.tenant):
        raise not_found(KIND, subscription_id)
    return Response(status_code=204)


@router.post(
    "/subscriptions/{subscription_id}/rotate-secret",
    response_model=SubscriptionView,
    responses=responses(401, 404, 409, 422, 503),
    summary="Make a new secret (answered once); the previous one still signs for `previousValidSec`",
)
async def rotate_secret(
    subscription_id: SubscriptionId,
    state: State,
    principal: Authenticated,
    previous_valid_sec: Annotated[
        int,
        Query(
            alias="previousValidSec",
            ge=0,
            le=MAX_OVERLAP_SEC,
            description="How long requests still carry a signature with the previous secret too, beside the new "
            "one: the time the receiver needs to switch (0: stop at once).",
        ),
    ] = 86_400,
) -> Response:
    row = await _get(state, principal.tenant, subscription_id)
    cipher = await state.keyring.cipher(principal.tenant)
    current = cipher.open_json(row["secrets"], SECRETS)
    secret = new_secret()
    rotated = await state.stores.notifications.rotate_secret(
        row["id"], principal.tenant, row["secrets"], cipher.seal_json([secret, current[0]], SECRETS), previous_valid_sec
    )
    if rotated is None:
        raise ProblemError(409, f"subscription {subscription_id} changed meanwhile (another rotation?): try again")
    return OrjsonResponse(render_subscription(rotated, secret))


@router.get(
    "/subscriptions/{subscription_id}/deliveries",
    response_model=DeliveryList,
    responses=responses(401, 404, 422, 503),
    summary="The subscription's delivery log, newest first: each incident, its attempts and the last answer",
)
async def delivery_log(
    subscription_id: SubscriptionId,
    state: State,
    principal: Authenticated,
    limit: Annotated[int, Query(ge=1, le=500, description="At most this many deliveries.")] = 50,
) -> Response:
    row = await _get(state, principal.tenant, subscription_id)
    rows = await state.stores.notifications.delivery_log(row["id"], principal.tenant, limit)
    return OrjsonResponse({"items": [render_delivery(r) for r in rows]})


@router.post(
    "/subscriptions/{subscription_id}/test",
    response_model=TestSendView,
    responses=responses(401, 404, 503),
    summary="Send a signed `test` event to the subscription now, once, and answer what the receiver said",
)
async def test_send(subscription_id: SubscriptionId, state: State, principal: Authenticated) -> Response:
    ident = parse_resource_id(KIND, subscription_id)
    delivery_id = await state.stores.notifications.insert_test_delivery(
        ident, principal.tenant, state.notifications.config.lease_sec
    )
    if delivery_id is None:
        raise not_found(KIND, subscription_id)
    sent, outcome = await state.notifications.send_now(delivery_id)
    view = TestSendView(
        delivery_id=str(delivery_id), delivered=sent == "DELIVERED", status=outcome.status, error=outcome.error
    )
    return OrjsonResponse(view.model_dump(mode="json", by_alias=True))


async def _get(state: ApiState, tenant: str, raw: str) -> Record:
    row = await state.stores.notifications.get_subscription(parse_resource_id(KIND, raw), tenant)
    if row is None:
        raise not_found(KIND, raw)
    return row


def _shown(cipher: TenantCipher, row: Record) -> str:
    secrets = cipher.open_json(row["secrets"], SECRETS)
    return redact(secrets[0] if secrets else None)
