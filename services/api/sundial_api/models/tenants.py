"""Tenants: the registry as operators see it (`/v1/admin/tenants`): create, patch, the tenant view."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StrictFloat, StrictInt, StrictStr
from sundial_client.models.tenants import QuotasView, TenantList, TenantState, TenantView
from sundial_common.security.auth import TENANT
from sundial_common.stores.tenants import Tenant

from sundial_api.models.breakers import BreakerSettingsBody
from sundial_api.models.common import RequestModel
from sundial_api.models.jobs import MAX_JITTER_SEC

MAX_WEIGHT = 1000


PositiveRate = Annotated[StrictFloat, Field(gt=0, le=1_000_000)]


class QuotasBody(RequestModel):
    """Per-tenant limits. A quota left out (or null) is unlimited."""

    max_active_jobs: Annotated[StrictInt, Field(ge=0, le=1_000_000_000)] | None = Field(
        None, description="Jobs that can still fire (ACTIVE or PAUSED); a create beyond it → 403 `quota-exceeded`."
    )
    max_creates_per_sec: PositiveRate | None = Field(
        None, description="Job creates per second (burst: one second's worth); beyond it → 429 with Retry-After."
    )
    max_concurrent_executions: Annotated[StrictInt, Field(ge=1, le=1_000_000)] | None = Field(
        None, description="PENDING or RUNNING executions at once; due work beyond it waits (late, never lost)."
    )
    max_dispatch_per_sec: PositiveRate | None = Field(
        None, description="Executions dispatched per second, across every dispatcher; due work beyond it waits."
    )


class TenantCreate(RequestModel):
    id: StrictStr = Field(
        description="The tenant's name, as tokens carry it: a letter or digit, then letters, digits, `.`, `_`, `-`; "
        "at most 64 characters.",
        pattern=TENANT,
        examples=["acme"],
    )
    display_name: StrictStr | None = Field(None, max_length=200, description="A name for people.")
    weight: Annotated[StrictInt, Field(ge=1, le=MAX_WEIGHT)] = Field(
        1, description="Share of dispatch while tenants contend for it (2 gets twice the share of 1)."
    )
    quotas: QuotasBody = Field(default_factory=QuotasBody)
    default_jitter_sec: Annotated[StrictInt, Field(ge=0, le=MAX_JITTER_SEC)] = Field(
        0,
        description="Jitter given to the tenant's CRON jobs that set no `jitterSec` of their own (spreads "
        "`0 0 * * *` stampedes over this window; a job opts out with `jitterSec: 0`).",
    )
    breaker: BreakerSettingsBody | None = Field(
        None, description="Retry circuit breaker settings of the tenant's own (absent: the service defaults)."
    )


class TenantPatch(RequestModel):
    """Fields to change; `quotas` replaces the quotas given (a quota set to null becomes unlimited)."""

    display_name: StrictStr | None = Field(None, max_length=200)
    weight: Annotated[StrictInt, Field(ge=1, le=MAX_WEIGHT)] | None = None
    quotas: QuotasBody | None = None
    default_jitter_sec: Annotated[StrictInt, Field(ge=0, le=MAX_JITTER_SEC)] | None = None
    breaker: BreakerSettingsBody | None = Field(
        None, description="Replaces the tenant's breaker settings (null or `{}`: back to the service defaults)."
    )


def render_tenant(tenant: Tenant) -> dict[str, object]:
    q = tenant.quotas
    return {
        "id": tenant.id,
        "displayName": tenant.display_name,
        "weight": tenant.weight,
        "quotas": {
            "maxActiveJobs": q.max_active_jobs,
            "maxCreatesPerSec": q.max_creates_per_sec,
            "maxConcurrentExecutions": q.max_concurrent_executions,
            "maxDispatchPerSec": q.max_dispatch_per_sec,
        },
        "defaultJitterSec": tenant.default_jitter_sec,
        "breaker": dict(tenant.breaker) if tenant.breaker is not None else None,
        "state": tenant.state,
        "version": tenant.version,
        "createdAt": tenant.created_at,
        "updatedAt": tenant.updated_at,
    }
