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


class PoolDelivery(enum.StrEnum):
    WORKER = "worker"
    HTTP = "http"


class PoolView(ViewModel):
    name: str
    owner: str | None = Field(description="The owning tenant; null for a shared pool.")
    shared_with: list[str] = Field(description="The tenants a shared pool admits; empty for an owned pool.")
    kind: PoolKind
    delivery: PoolDelivery = Field(
        PoolDelivery.WORKER,
        description="`worker`: the tenant's workers run its executions; `http`: Sundial POSTs each to the pool's "
        "target (`PUT /v1/pools/{name}/target`).",
    )
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


class WorkerView(ViewModel):
    """A live worker of the pool, as it last announced itself (renewed every few seconds)."""

    worker_id: str
    handlers: list[str] = Field(description="The handler names it serves.")
    concurrency: int
    free_slots: int = Field(description="Handlers it could start now (concurrency minus those running).")
    version: str = Field(description="Its `sundial-worker` version.")
    host: str
    pid: int
    started_at: datetime
    expires_at: datetime | None = Field(description="When it drops out of the pool unless it announces itself again.")


class PoolWorkers(ViewModel):
    live: int = Field(description="Live workers reading the pool.")
    free_slots: int = Field(description="Their free handler slots, summed.")
    handlers: list[str] = Field(description="Every handler some live worker serves.")
    items: list[WorkerView]


class PoolBacklog(ViewModel):
    pending: int = Field(description="The caller's executions of this pool waiting for a worker (PENDING).")
    oldest_pending_at: datetime | None = Field(description="Creation of the oldest of them.")


class PoolDetail(PoolView):
    """A pool as its tenant sees it (`GET /v1/pools/{name}`): the registry entry, who serves it now, and the caller's
    work waiting in it."""

    workers: PoolWorkers
    backlog: PoolBacklog = Field(description="The caller's own work only (in a shared pool, not the others').")
    warnings: list[str] = Field(
        description='What would keep the caller\'s work from running, e.g. "no live worker in pool files" while '
        "executions wait in it. Empty when nothing does."
    )


class PoolTokenView(ViewModel):
    """A pool token's registry entry: the credential of workers behind the worker gateway."""

    id: str = Field(description="The token's id (its `jti`): what `DELETE …/tokens/{id}` revokes.")
    pool: str
    tenant: str = Field(description="The one tenant whose work the token may take.")
    subject: str = Field(description="Who holds it (the JWT's `sub`).")
    created_by: str = Field(description="Who minted it.")
    ttl_sec: int = Field(description="Lifetime of each JWT issued for it: the first and every refresh.")
    created_at: datetime
    revoked_at: datetime | None = Field(description="When it was revoked; null while it is valid.")


class PoolTokenIssued(PoolTokenView):
    """A pool token just minted: `token` is shown this once (Sundial keeps only its id)."""

    token: str = Field(description="The JWT a worker sends to the worker gateway (`Authorization: Bearer …`).")
    expires_at: datetime = Field(description="When this JWT expires unless refreshed (`POST /v1/worker/token`).")


class PoolTokenList(ViewModel):
    items: list[PoolTokenView]


class PoolTargetView(ViewModel):
    """An HTTP pool's target: where Sundial POSTs its executions, signed with `secret`."""

    pool: str
    url: str = Field(description="The base URL.")
    paths: dict[str, str] = Field(description="Handler name → path under `url`.")
    secret: str = Field(
        description="The signing secret (Standard Webhooks, `whsec_…`): in full only in the answer that made it, "
        "redacted everywhere else."
    )
    updated_by: str
    created_at: datetime
    updated_at: datetime
