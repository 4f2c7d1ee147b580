"""Tenants: a registered tenant (`/v1/admin/tenants`), its quotas, and its pages."""

from __future__ import annotations

import enum
from datetime import datetime

from pydantic import Field

from sundial_client.models.breakers import BreakerSettingsView
from sundial_client.models.common import ViewModel


class TenantState(enum.StrEnum):
    ACTIVE = "ACTIVE"
    SUSPENDED = "SUSPENDED"


class QuotasView(ViewModel):
    max_active_jobs: int | None
    max_creates_per_sec: float | None
    max_concurrent_executions: int | None
    max_dispatch_per_sec: float | None


class TenantView(ViewModel):
    id: str
    display_name: str | None
    weight: int
    quotas: QuotasView
    default_jitter_sec: int
    breaker: BreakerSettingsView | None = Field(
        None, description="The tenant's own retry circuit breaker settings (null: the service defaults)."
    )
    state: TenantState
    version: int
    created_at: datetime | None
    updated_at: datetime | None


class TenantList(ViewModel):
    items: list[TenantView]
    next_cursor: str | None
