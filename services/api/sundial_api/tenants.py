"""Tenants as the API sees them: the quotas a create must pass, and the operators' registry endpoints
(``/v1/admin/tenants``). The registry cache every request consults is :mod:`sundial_api.tenant_cache`.

**Quotas** (absent = unlimited). ``maxCreatesPerSec`` is a token bucket in Redis shared by the replicas
(:mod:`sundial_common.hotwindow.rate_limits`): over it, 429 with ``Retry-After``. ``maxActiveJobs`` is counted inside
the
create's own transaction under a per-tenant lock (:mod:`sundial_common.stores.tenants`), so two creates can
never both take the last slot: over it, 403 ``quota-exceeded`` naming the quota and the count. Either way
nothing is written; a batch answers per item.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from redis.exceptions import RedisError
from starlette.responses import Response
from sundial_common.security.auth import Principal
from sundial_common.stores.breakers import BreakerSettings
from sundial_common.stores.tenants import ACTIVE, SUSPENDED, Quotas, Tenant

from sundial_api.auth import Authenticated
from sundial_api.json_body import JsonRoute
from sundial_api.models.breakers import BreakerSettingsBody
from sundial_api.models.tenants import QuotasBody, TenantCreate, TenantList, TenantPatch, TenantView, render_tenant
from sundial_api.problems import ProblemError, field_error, invalid, responses
from sundial_api.responses import OrjsonResponse
from sundial_api.state import ApiState, State

log = logging.getLogger("sundial.api")


class QuotaExceededError(ProblemError):
    def __init__(self, quota: str, limit: int, current: int) -> None:
        message = f"the tenant's {quota} quota is {limit} and it has {current}; delete or cancel jobs, or ask an "
        message += "operator to raise the quota"
        super().__init__(403, message, errors=[field_error(f"quotas.{quota}", message)], slug="quota-exceeded")
        self.quota = quota
        self.limit = limit
        self.current = current


async def check_create_rate(state: ApiState, tenant: Tenant | None) -> None:
    """One create against the tenant's ``maxCreatesPerSec``: 429 with Retry-After when it is used up."""
    rate = tenant.quotas.max_creates_per_sec if tenant is not None else None
    if tenant is not None and rate is not None:
        granted, retry_after_ms = await take_creates(state, tenant, 1)
        if not granted:
            raise rate_limited(rate, retry_after_ms)


async def take_creates(state: ApiState, tenant: Tenant | None, creates: int) -> tuple[int, int]:
    """Take ``creates`` tokens of the tenant's ``maxCreatesPerSec``: (how many were granted, ms until the next).

    Unlimited, or Redis unreachable: all of them (a cache outage must not stop creates; logged).
    """
    rate = tenant.quotas.max_creates_per_sec if tenant is not None else None
    if tenant is None or rate is None:
        return creates, 0
    try:
        grant = await state.buckets.take(f"creates:{tenant.id}", rate, creates)
    except (RedisError, OSError) as exc:
        log.warning("create-rate quota not checked (Redis: %r)", exc)
        return creates, 0
    return grant.granted, grant.retry_after_ms


def rate_limited(rate: float, retry_after_ms: int) -> ProblemError:
    message = f"the tenant's maxCreatesPerSec quota ({rate:g}/s) is used up; retry after the Retry-After delay"
    return ProblemError(
        429,
        message,
        errors=[field_error("quotas.maxCreatesPerSec", message)],
        headers={"Retry-After": str(max(1, math.ceil(retry_after_ms / 1000)))},
        slug="rate-limited",
    )


# --- the registry endpoints ---------------------------------------------------------------------------

router = APIRouter(prefix="/v1/admin/tenants", tags=["tenants"], route_class=JsonRoute)

TenantId = Annotated[str, Path(description="The tenant's id (the name its tokens carry).")]


def _admin(principal: Principal) -> None:
    if not principal.admin:
        raise ProblemError(403, "this endpoint needs an admin token (`sundial token --tenant <t> --admin`)")


def _quotas(body: QuotasBody) -> Quotas:
    return Quotas(
        max_active_jobs=body.max_active_jobs,
        max_creates_per_sec=float(body.max_creates_per_sec) if body.max_creates_per_sec is not None else None,
        max_concurrent_executions=body.max_concurrent_executions,
        max_dispatch_per_sec=float(body.max_dispatch_per_sec) if body.max_dispatch_per_sec is not None else None,
    )


def _breaker(body: BreakerSettingsBody | None) -> dict[str, Any] | None:
    """The overrides to store; 422 naming the field when they do not make sense together with the defaults
    (``maxCooldownSec`` below ``cooldownSec``)."""
    overrides = body.overrides() if body is not None else None
    try:
        BreakerSettings().merged(overrides)
    except ValueError as exc:
        field, _, message = str(exc).partition(" ")
        raise invalid(f"breaker.{field}", message) from None
    return overrides


def _answer(state: ApiState, tenant: Tenant, status_code: int = 200) -> Response:
    state.tenant_cache.put(tenant)
    headers = {"ETag": f'"{tenant.version}"'}
    if status_code == 201:
        headers["Location"] = f"/v1/admin/tenants/{tenant.id}"
    return OrjsonResponse(render_tenant(tenant), status_code=status_code, headers=headers)


async def _get(state: ApiState, tenant_id: str) -> Tenant:
    tenant = await state.stores.tenants.get_tenant(tenant_id)
    if tenant is None:
        raise ProblemError(404, f"tenant {tenant_id} is not registered")
    return tenant


@router.post(
    "",
    status_code=201,
    response_model=TenantView,
    responses=responses(401, 403, 409, 422, 503),
    summary="Register a tenant (admin token)",
)
async def create_tenant(body: TenantCreate, state: State, principal: Authenticated) -> Response:
    _admin(principal)
    tenant = Tenant(
        id=body.id,
        display_name=body.display_name,
        weight=body.weight,
        quotas=_quotas(body.quotas),
        default_jitter_sec=body.default_jitter_sec,
        breaker=_breaker(body.breaker),
    )
    created = await state.stores.tenants.create_tenant(tenant)
    if created is None:
        raise ProblemError(
            409, f"tenant {body.id} is already registered", errors=[field_error("id", "is already registered")]
        )
    return _answer(state, created, 201)


@router.get("", response_model=TenantList, responses=responses(401, 403, 422, 503), summary="List tenants")
async def list_tenants(
    state: State,
    principal: Authenticated,
    limit: Annotated[int, Query(ge=1, le=500, description="Page size.")] = 100,
    cursor: Annotated[str | None, Query(description="`nextCursor` of the previous page.")] = None,
) -> Response:
    _admin(principal)
    after = _decode_cursor(cursor) if cursor is not None else None
    rows = await state.stores.tenants.list_tenants(after, limit + 1)
    page = rows[:limit]
    next_cursor = "t1:" + page[-1].id if len(rows) > limit else None
    return OrjsonResponse({"items": [render_tenant(t) for t in page], "nextCursor": next_cursor})


def _decode_cursor(cursor: str) -> str:
    if not cursor.startswith("t1:") or len(cursor) < 4:
        raise invalid("cursor", "is not a cursor this endpoint returned")
    return cursor[3:]


@router.get("/{tenant_id}", response_model=TenantView, responses=responses(401, 403, 404, 503), summary="A tenant")
async def get_tenant(tenant_id: TenantId, state: State, principal: Authenticated) -> Response:
    _admin(principal)
    return _answer(state, await _get(state, tenant_id))


@router.patch(
    "/{tenant_id}",
    response_model=TenantView,
    responses=responses(401, 403, 404, 412, 422, 503),
    summary="Change a tenant's display name, weight, quotas, default jitter or breaker settings",
)
async def update_tenant(tenant_id: TenantId, body: TenantPatch, state: State, principal: Authenticated) -> Response:
    _admin(principal)
    current = await _get(state, tenant_id)
    given = body.model_fields_set
    changes: dict[str, Any] = {}
    if "display_name" in given:
        changes["display_name"] = body.display_name
    if "weight" in given:
        if body.weight is None:
            raise invalid("weight", "cannot be null (1 is the default share)")
        changes["weight"] = body.weight
    if "default_jitter_sec" in given:
        if body.default_jitter_sec is None:
            raise invalid("defaultJitterSec", "cannot be null (0 turns it off)")
        changes["default_jitter_sec"] = body.default_jitter_sec
    if "breaker" in given:
        changes["breaker"] = _breaker(body.breaker)
    if "quotas" in given:
        new = body.quotas or QuotasBody()
        merged = {
            name: getattr(_quotas(new), name) if name in new.model_fields_set else getattr(current.quotas, name)
            for name in Quotas.__dataclass_fields__
        }
        changes["quotas"] = Quotas(**merged)
    return await _write(state, current, **changes)


async def _write(api: ApiState, current: Tenant, **changes: Any) -> Response:
    updated = await api.stores.tenants.update_tenant(dataclasses.replace(current, **changes), current.version)
    if updated is None:
        raise ProblemError(412, f"tenant {current.id} changed meanwhile; read it again and retry")
    return _answer(api, updated)


@router.post(
    "/{tenant_id}/suspend",
    response_model=TenantView,
    responses=responses(401, 403, 404, 503),
    summary="Suspend a tenant: its writes are refused (403) and its jobs stop dispatching",
)
async def suspend_tenant(tenant_id: TenantId, state: State, principal: Authenticated) -> Response:
    _admin(principal)
    current = await _get(state, tenant_id)
    return _answer(state, current) if current.state == SUSPENDED else await _write(state, current, state=SUSPENDED)


@router.post(
    "/{tenant_id}/resume",
    response_model=TenantView,
    responses=responses(401, 403, 404, 503),
    summary="Resume a suspended tenant: its jobs dispatch again, missed fires by their catch-up policy",
)
async def resume_tenant(tenant_id: TenantId, state: State, principal: Authenticated) -> Response:
    _admin(principal)
    current = await _get(state, tenant_id)
    return _answer(state, current) if current.state == ACTIVE else await _write(state, current, state=ACTIVE)
