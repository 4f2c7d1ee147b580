"""Pools: a registered pool (`/v1/admin/pools`, `GET /v1/pools`) and its pages."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from pydantic import Field

from sundial_client.models.common import ViewModel


class PoolKind(enum.StrEnum):
    PRODUCTION = "production"
    STAGING = "staging"


class PoolView(ViewModel):
    name: str
    owner: str | None = Field(description="The owning tenant; null for a shared pool.")
    shared_with: list[str] = Field(description="The tenants a shared pool admits; empty for an owned pool.")
    kind: PoolKind
    partitions: int | None = Field(description="Partitions its topic was created with (null: created elsewhere).")
    retention_ms: int | None
    default_timeout_sec: int | None
    default_retry_policy: dict[str, Any] | None
    version: int
    created_at: datetime | None
    updated_at: datetime | None


class PoolList(ViewModel):
    items: list[PoolView]
    next_cursor: str | None
