"""``/v1/admin/notification-destinations``: an administrator lets one tenant's subscriptions reach one destination
that is not public.

Webhooks may reach only public addresses (:mod:`sundial_common.delivery.address_policy`); an administrator may
open whole networks to every tenant (``SUNDIAL_DELIVERY_ALLOWED_NETWORKS``), which is too wide when one team's
receiver runs inside the deployment. Here an administrator allows one **destination** — a URL's scheme, host and
port (its *origin*) — to one **tenant**, at the addresses the host resolves to at that moment: a later DNS answer
pointing the same name elsewhere inside (rebinding, or a moved service) is refused again until allowed again, and
no other tenant, host or port gains anything. A subscription the tenant makes to that origin keeps a copy of the
allowance, which every send uses; withdrawing it (``DELETE``) clears the copies, so the next send is refused.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, Query
from pydantic import Field, StrictStr
from starlette.responses import Response
from sundial_client.models.notifications import AllowedDestination, AllowedDestinationList
from sundial_common.delivery.address_policy import IPNetwork
from sundial_common.delivery.sender import SystemResolver, URLRefused, check_url
from sundial_common.security.auth import Principal
from sundial_common.stores.types import Record

from sundial_api.auth import Authenticated
from sundial_api.json_body import JsonRoute
from sundial_api.models.common import RequestModel
from sundial_api.problems import ProblemError, invalid, responses
from sundial_api.responses import OrjsonResponse
from sundial_api.state import ApiState, State

router = APIRouter(prefix="/v1/admin/notification-destinations", tags=["notifications"], route_class=JsonRoute)


class DestinationAllow(RequestModel):
    """A destination one tenant's subscriptions may reach although its addresses are not public."""

    tenant: StrictStr = Field(min_length=1, max_length=100, description="The tenant allowed.")
    url: StrictStr = Field(
        max_length=2000,
        description="A URL of the destination: its scheme, host and port are allowed, at the addresses the host "
        "resolves to now.",
        examples=["https://alerts.internal:8443/sundial"],
    )


def origin_of(url: str, allow_http: bool) -> str:
    """``scheme://host:port`` of ``url`` (the port spelled out), or :class:`URLRefused`."""
    parsed = check_url(url, allow_http)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return f"{parsed.scheme}://{parsed.host}:{port}"


def allowed_networks(addresses: list[str] | None) -> tuple[IPNetwork, ...]:
    """A subscription's copy of its allowance as networks of one address each."""
    return tuple(ipaddress.ip_network(a) for a in addresses or ())


async def allowance_for(state: ApiState, tenant: str, url: str) -> Record | None:
    """The allowance covering ``url`` for ``tenant``, if an administrator gave one."""
    try:
        origin = origin_of(url, state.notifications.sender.config.allow_http)
    except URLRefused:
        return None
    return await state.stores.notifications.allowed_destination(tenant, origin)


@router.post(
    "",
    status_code=201,
    response_model=AllowedDestination,
    responses=responses(401, 403, 422, 503),
    summary="Allow one tenant's subscriptions to reach one destination (scheme, host, port) at its addresses now",
)
async def allow_destination(body: DestinationAllow, state: State, principal: Authenticated) -> Response:
    _admin(principal)
    if await state.stores.tenants.get_tenant(body.tenant) is None:
        raise invalid("tenant", f"no tenant {body.tenant!r}")
    try:
        origin = origin_of(body.url, state.notifications.sender.config.allow_http)
    except URLRefused as exc:
        raise invalid("url", str(exc)) from None
    parsed = httpx.URL(body.url)
    try:
        addresses = [ipaddress.ip_address(parsed.host)]
    except ValueError:
        try:
            addresses = await SystemResolver().resolve(parsed.host, int(origin.rsplit(":", 1)[1]))
        except OSError as exc:
            raise invalid("url", f"{parsed.host} does not resolve: {exc.strerror or exc}") from None
    row = await state.stores.notifications.allow_destination(
        body.tenant, origin, sorted({str(a) for a in addresses}), principal.subject
    )
    return OrjsonResponse(_render(row), status_code=201)


@router.get(
    "",
    response_model=AllowedDestinationList,
    responses=responses(401, 403, 503),
    summary="The destinations allowed, per tenant",
)
async def list_destinations(
    state: State,
    principal: Authenticated,
    tenant: Annotated[str | None, Query(description="Only this tenant's.")] = None,
) -> Response:
    _admin(principal)
    rows = await state.stores.notifications.allowed_destinations(tenant)
    return OrjsonResponse({"items": [_render(r) for r in rows]})


@router.delete(
    "",
    status_code=204,
    responses=responses(401, 403, 404, 422, 503),
    summary="Withdraw an allowance: the tenant's subscriptions to that destination are refused from their next send",
)
async def revoke_destination(
    state: State,
    principal: Authenticated,
    tenant: Annotated[str, Query(description="The tenant allowed.")],
    url: Annotated[str, Query(description="A URL of the destination allowed.")],
) -> Response:
    _admin(principal)
    try:
        origin = origin_of(url, state.notifications.sender.config.allow_http)
    except URLRefused as exc:
        raise invalid("url", str(exc)) from None
    if not await state.stores.notifications.revoke_destination(tenant, origin):
        raise ProblemError(404, f"no allowance of {origin} for tenant {tenant!r}")
    return Response(status_code=204)


def _admin(principal: Principal) -> None:
    if not principal.admin:
        raise ProblemError(403, "this endpoint needs an admin token (`sundial token --tenant <t> --admin`)")


def _render(row: Record) -> dict[str, Any]:
    view = AllowedDestination(
        tenant=row["tenant_id"],
        origin=row["origin"],
        addresses=list(row["addresses"]),
        allowed_by=row["allowed_by"],
        created_at=row["created_at"],
    )
    return view.model_dump(mode="json", by_alias=True)
