"""Pools: the registry as operators write it (`/v1/admin/pools`) and the pool view tenants read (`GET /v1/pools`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StrictInt, StrictStr
from sundial_client.models.pools import PoolDelivery, PoolDetail, PoolKind, PoolList, PoolView
from sundial_common.hotwindow.worker_announcements import WorkerAnnouncement
from sundial_common.security.auth import TENANT
from sundial_common.security.pool_tokens import DEFAULT_TTL_SEC, MAX_TTL_SEC
from sundial_common.stores.pool_tokens import PoolTokenRecord
from sundial_common.stores.pools import Pool

from sundial_api.models.common import RequestModel
from sundial_api.models.jobs import MAX_TIMEOUT_SEC, RetryPolicy

MAX_SHARED = 100

TenantName = Annotated[StrictStr, Field(pattern=TENANT)]


class PoolCreate(RequestModel):
    """A pool to register: exactly one of `owner` and `sharedWith` says who may send work into it."""

    name: StrictStr = Field(
        description="The pool's name (its topic is `sundial.pool.<name>`): 1-63 of a-z, 0-9, `.`, `_`, `-`, "
        "starting with a letter or digit. It cannot be renamed.",
        pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$",
        examples=["email"],
    )
    owner: StrictStr | None = Field(
        None, pattern=TENANT, description="The tenant the pool belongs to (a registered tenant).", examples=["acme"]
    )
    shared_with: list[TenantName] | None = Field(
        None,
        min_length=1,
        max_length=MAX_SHARED,
        description="A shared pool: the registered tenants allowed to use it (instead of an `owner`).",
    )
    kind: PoolKind = Field(
        PoolKind.PRODUCTION,
        description="`production`, or `staging`: fed only by replays (the only kind a replay may target).",
    )
    delivery: PoolDelivery = Field(
        PoolDelivery.WORKER,
        description="`worker`: the tenant's workers run its executions; `http`: Sundial's delivery workers POST each "
        "to the target the owning tenant sets (`PUT /v1/pools/{name}/target`).",
    )
    partitions: Annotated[StrictInt, Field(ge=1, le=1000)] = Field(
        4, description="Partitions of the pool's topic (at most as many workers consume it in parallel)."
    )
    retention_ms: Annotated[StrictInt, Field(ge=60_000)] | None = Field(
        None,
        description="`retention.ms` of the pool's topic: how far back a replay reaches (default "
        "SUNDIAL_TOPIC_RETENTION_MS).",
    )
    default_timeout_sec: Annotated[StrictInt, Field(ge=1, le=MAX_TIMEOUT_SEC)] | None = Field(
        None, description="`timeoutSec` of a job created in this pool without one."
    )
    default_retry_policy: RetryPolicy | None = Field(
        None, description="`retryPolicy` of a job created in this pool without one."
    )


class PoolPatch(RequestModel):
    """Fields to change. Giving `owner` makes the pool owned, giving `sharedWith` makes it shared. The topic's
    `partitions` and `retentionMs` are fixed when the pool is created; a pool cannot be renamed."""

    owner: StrictStr | None = Field(None, pattern=TENANT)
    shared_with: list[TenantName] | None = Field(None, min_length=1, max_length=MAX_SHARED)
    kind: PoolKind | None = None
    delivery: PoolDelivery | None = None
    default_timeout_sec: Annotated[StrictInt, Field(ge=1, le=MAX_TIMEOUT_SEC)] | None = None
    default_retry_policy: RetryPolicy | None = None


class PoolTokenCreate(RequestModel):
    """A pool token to mint: who holds it, whose work it takes, how long each of its JWTs lives."""

    tenant: StrictStr | None = Field(
        None,
        pattern=TENANT,
        description="The tenant whose work the token may take: an owned pool's owner (the default), or, for a "
        "shared pool (admin only), one of the tenants it is shared with (required).",
        examples=["acme"],
    )
    subject: StrictStr | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$",
        description="Who holds the token, for logs (its `sub`; default `<pool>-worker`).",
        examples=["billing-workers"],
    )
    ttl_sec: Annotated[StrictInt, Field(ge=60, le=MAX_TTL_SEC)] = Field(
        DEFAULT_TTL_SEC,
        description="Lifetime in seconds of the token and of each refreshed one (60 s to 30 days; default 1 hour).",
    )


def render_pool_token(token: PoolTokenRecord) -> dict[str, object]:
    return {
        "id": token.id,
        "pool": token.pool,
        "tenant": token.tenant,
        "subject": token.subject,
        "createdBy": token.created_by,
        "ttlSec": token.ttl_sec,
        "createdAt": token.created_at,
        "revokedAt": token.revoked_at,
    }


def render_pool(pool: Pool) -> dict[str, object]:
    return {
        "name": pool.name,
        "owner": pool.owner,
        "sharedWith": list(pool.shared_with),
        "kind": pool.kind,
        "delivery": pool.delivery,
        "partitions": pool.partitions,
        "retentionMs": pool.retention_ms,
        "defaultTimeoutSec": pool.default_timeout_sec,
        "defaultRetryPolicy": pool.default_retry_policy,
        "version": pool.version,
        "createdAt": pool.created_at,
        "updatedAt": pool.updated_at,
    }


def render_worker(worker: WorkerAnnouncement) -> dict[str, object]:
    return {
        "workerId": worker.worker_id,
        "handlers": list(worker.handlers),
        "concurrency": worker.concurrency,
        "freeSlots": worker.free_slots,
        "version": worker.version,
        "host": worker.host,
        "pid": worker.pid,
        "startedAt": worker.started_at,
        "expiresAt": worker.expires_at,
    }
