"""Pools as the API sees them: the check every entry point of work makes, and the registry endpoints.

**The check** (:func:`usable_pool`): a job create, each batch item, a PATCH that changes ``target``, a trigger
and a replay name a pool; it must be registered (else 422 naming the field) and admit the caller's tenant —
its owner, or one of the tenants it is shared with (else 403 naming the pool) — and, for a job's work, not be a
staging pool (422: its workers run replayed messages only). The check runs before anything
is written, against the registry cache (:mod:`sundial_common.stores.pool_cache`, ``SUNDIAL_TENANT_CACHE_SEC``), so a
create pays no extra query while the entry is fresh; a refusal reads the entry again first (at most four times a
second per pool), so a pool registered or shared a moment ago through another replica is not refused. Each
refusal is logged (tenant, pool, job) and counted in
``sundial_pool_refusals_total{where="api"}``.

**The registry** — ``/v1/admin/pools`` (admin tokens): create (registers the pool and creates its topic),
list, read, change (owner or shared tenants, kind, job defaults; compare-and-set on ``If-Match``), delete
(409 naming how many jobs that can still fire target it). ``GET /v1/pools``: the pools the caller's tenant
may use.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Annotated, Any

from confluent_kafka import KafkaException
from fastapi import APIRouter, Header, Path, Query
from starlette.responses import Response
from sundial_common.broker.kafka import ensure_topics
from sundial_common.broker.messages import pool_topic
from sundial_common.observability.metrics import POOL_REFUSALS, Children
from sundial_common.security.auth import Principal
from sundial_common.stores.pools import Pool

from sundial_api.auth import Authenticated
from sundial_api.json_body import JsonRoute
from sundial_api.models.jobs import JobCreate, RetryPolicy
from sundial_api.models.pools import PoolCreate, PoolList, PoolPatch, PoolView, render_pool
from sundial_api.problems import ProblemError, field_error, invalid, responses
from sundial_api.responses import OrjsonResponse
from sundial_api.state import ApiState, State

log = logging.getLogger("sundial.api")

_refusals: Children[Any] = Children(POOL_REFUSALS)


def refused(reason: str, *, tenant: str, pool: str, field: str, **context: Any) -> None:
    """Log and count one refusal (where the audit trail will record it too)."""
    _refusals("api", reason).inc()
    log.warning(
        "pool refused (%s): tenant %s, pool %s, field %s",
        reason,
        tenant,
        pool,
        field,
        extra={"tenant": tenant, "pool": pool, "reason": reason, **{k: str(v) for k, v in context.items()}},
    )


async def usable_pool(
    state: ApiState, tenant: str, name: str, field: str, *, replay_target: bool = False, **context: Any
) -> Pool:
    """The registered pool ``name`` if ``tenant`` may use it; else 422 (unregistered) or 403 (not its pool). Work
    for a job (``replay_target`` false) may not go to a staging pool (422): its workers run replayed messages only,
    so a job's execution there would never run."""
    pool = await state.pool_cache.get(name)
    if pool is None or not pool.admits(tenant) or (pool.staging and not replay_target):
        pool = await state.pool_cache.recheck(name)  # never refuse for a stale entry
    if pool is None:
        refused("unregistered", tenant=tenant, pool=name, field=field, **context)
        raise invalid(field, f"names pool `{name}`, which is not registered (an operator registers pools)")
    if not pool.admits(tenant):
        refused("forbidden", tenant=tenant, pool=name, field=field, **context)
        message = f"pool `{name}` is not open to tenant {tenant}"
        raise ProblemError(403, message, errors=[field_error(field, message)], slug="pool-forbidden")
    if pool.staging and not replay_target:
        refused("staging", tenant=tenant, pool=name, field=field, **context)
        raise invalid(
            field,
            f"names pool `{name}`, a staging pool: it runs replayed messages only (a replay's `targetPool`), "
            "so a job's executions there would never run",
        )
    return pool


def with_pool_defaults(body: JobCreate, pool: Pool) -> JobCreate:
    """``body`` with the pool's defaults filled in where the create gave none (timeout, retry policy)."""
    update: dict[str, Any] = {}
    if pool.default_timeout_sec is not None and body.timeout_sec is None:
        update["timeout_sec"] = pool.default_timeout_sec
    if pool.default_retry_policy is not None and "retry_policy" not in body.model_fields_set:
        update["retry_policy"] = RetryPolicy.model_validate(pool.default_retry_policy)
    return body.model_copy(update=update) if update else body


# --- the registry endpoints ---------------------------------------------------------------------------

admin_router = APIRouter(prefix="/v1/admin/pools", tags=["pools"], route_class=JsonRoute)
router = APIRouter(prefix="/v1/pools", tags=["pools"], route_class=JsonRoute)

PoolName = Annotated[str, Path(description="The pool's name.")]
_CURSOR = "p1:"


def _admin(principal: Principal) -> None:
    if not principal.admin:
        raise ProblemError(403, "this endpoint needs an admin token (`sundial token --tenant <t> --admin`)")


def _answer(state: ApiState, pool: Pool, status_code: int = 200) -> Response:
    state.pool_cache.put(pool)
    headers = {"ETag": f'"{pool.version}"'}
    if status_code == 201:
        headers["Location"] = f"/v1/admin/pools/{pool.name}"
    return OrjsonResponse(render_pool(pool), status_code=status_code, headers=headers)


async def _get(state: ApiState, name: str) -> Pool:
    pool = await state.stores.pools.get_pool(name)
    if pool is None:
        raise ProblemError(404, f"pool {name} is not registered")
    return pool


async def _check_tenants(state: ApiState, owner: str | None, shared_with: list[str] | None) -> None:
    """Exactly one of ``owner`` and ``sharedWith``, naming registered tenants (422 naming the field)."""
    if (owner is None) == (shared_with is None):
        raise invalid("owner", "give exactly one of `owner` (an owned pool) and `sharedWith` (a shared pool)")
    named = (
        [("owner", owner)] if owner is not None else [(f"sharedWith[{i}]", t) for i, t in enumerate(shared_with or [])]
    )
    for field, tenant in named:
        if await state.tenant_cache.get(tenant) is None:
            raise invalid(field, f"names tenant {tenant}, which is not registered")


def _retry_policy(policy: RetryPolicy | None) -> dict[str, Any] | None:
    return None if policy is None else policy.model_dump(mode="json", by_alias=True)


@admin_router.post(
    "",
    status_code=201,
    response_model=PoolView,
    responses=responses(401, 403, 409, 422, 503),
    summary="Register a pool and create its topic (admin token)",
)
async def create_pool(body: PoolCreate, state: State, principal: Authenticated) -> Response:
    _admin(principal)
    await _check_tenants(state, body.owner, body.shared_with)
    pool = Pool(
        name=body.name,
        owner=body.owner,
        shared_with=tuple(dict.fromkeys(body.shared_with or ())),
        kind=body.kind.value,
        delivery=body.delivery.value,
        partitions=body.partitions,
        retention_ms=body.retention_ms,
        default_timeout_sec=body.default_timeout_sec,
        default_retry_policy=_retry_policy(body.default_retry_policy),
    )
    # The topic first: a pool is never registered without one (creating it again is a no-op).
    try:
        await asyncio.to_thread(
            ensure_topics,
            state.settings.kafka_bootstrap,
            [pool_topic(pool.name)],
            body.partitions,
            retention_ms=body.retention_ms,
        )
    except KafkaException as exc:
        raise ProblemError(503, f"the broker did not create topic {pool_topic(pool.name)}: {exc}") from None
    created = await state.stores.pools.create_pool(pool)
    if created is None:
        raise ProblemError(
            409, f"pool {body.name} is already registered", errors=[field_error("name", "is already registered")]
        )
    log.info("pool %s registered", created.name, extra={"pool": created.name, "actor": principal.subject})
    return _answer(state, created, 201)


async def _page(state: ApiState, tenant: str | None, limit: int, cursor: str | None) -> Response:
    if cursor is not None and (not cursor.startswith(_CURSOR) or len(cursor) <= len(_CURSOR)):
        raise invalid("cursor", "is not a cursor this endpoint returned")
    after = cursor[len(_CURSOR) :] if cursor is not None else None
    rows = await state.stores.pools.list_pools(after, limit + 1, tenant)
    page = rows[:limit]
    next_cursor = _CURSOR + page[-1].name if len(rows) > limit else None
    if tenant is not None:  # a tenant learns that a pool is shared, not with whom
        page = [dataclasses.replace(p, shared_with=(tenant,)) if p.shared_with else p for p in page]
    return OrjsonResponse({"items": [render_pool(p) for p in page], "nextCursor": next_cursor})


Limit = Annotated[int, Query(ge=1, le=500, description="Page size.")]
Cursor = Annotated[str | None, Query(description="`nextCursor` of the previous page.")]


@admin_router.get("", response_model=PoolList, responses=responses(401, 403, 422, 503), summary="List every pool")
async def list_pools(state: State, principal: Authenticated, limit: Limit = 100, cursor: Cursor = None) -> Response:
    _admin(principal)
    return await _page(state, None, limit, cursor)


@router.get(
    "",
    response_model=PoolList,
    responses=responses(401, 422, 503),
    summary="The pools the caller's tenant may send work into",
    description="A shared pool's `sharedWith` names only the caller's tenant: who else shares it is not shown.",
)
async def my_pools(state: State, principal: Authenticated, limit: Limit = 100, cursor: Cursor = None) -> Response:
    return await _page(state, principal.tenant, limit, cursor)


@admin_router.get("/{name}", response_model=PoolView, responses=responses(401, 403, 404, 503), summary="A pool")
async def get_pool(name: PoolName, state: State, principal: Authenticated) -> Response:
    _admin(principal)
    return _answer(state, await _get(state, name))


@admin_router.patch(
    "/{name}",
    response_model=PoolView,
    responses=responses(401, 403, 404, 409, 412, 422, 503),
    summary="Change who may use a pool, its kind or its job defaults",
)
async def update_pool(
    name: PoolName,
    body: PoolPatch,
    state: State,
    principal: Authenticated,
    if_match: Annotated[
        str | None, Header(alias="If-Match", description='The pool\'s `version` (its ETag, e.g. `"2"`).')
    ] = None,
) -> Response:
    _admin(principal)
    current = await _get(state, name)
    given = body.model_fields_set
    changes: dict[str, Any] = {}
    if "owner" in given or "shared_with" in given:
        owner = body.owner if "owner" in given else None
        shared = body.shared_with if "shared_with" in given else None
        await _check_tenants(state, owner, shared)
        changes["owner"] = owner
        changes["shared_with"] = tuple(dict.fromkeys(shared or ()))
    if "kind" in given:
        if body.kind is None:
            raise invalid("kind", "cannot be null (`production` or `staging`)")
        changes["kind"] = body.kind.value
    if "delivery" in given:
        if body.delivery is None:
            raise invalid("delivery", "cannot be null (`worker` or `http`)")
        changes["delivery"] = body.delivery.value
    if "default_timeout_sec" in given:
        changes["default_timeout_sec"] = body.default_timeout_sec
    if "default_retry_policy" in given:
        changes["default_retry_policy"] = _retry_policy(body.default_retry_policy)
    expected = current.version
    if if_match is not None and if_match.strip() != "*":
        text = if_match.strip().removeprefix("W/").strip('"')
        if not text.isdigit():
            raise invalid("If-Match", f'`{if_match}` is not a pool version; send its ETag, e.g. "2"')
        expected = int(text)
    result = await state.stores.pools.update_pool(dataclasses.replace(current, **changes), expected)
    if result.active_jobs:
        message = (
            f"cannot become staging while {result.active_jobs} active jobs (ACTIVE or PAUSED) target the pool: "
            "a staging pool runs replayed messages only; cancel them or move them to another pool first"
        )
        raise ProblemError(409, f"pool {name} {message}", errors=[field_error("kind", message)])
    if result.pool is None:
        raise ProblemError(412, f"pool {name} changed meanwhile (or is not at version {expected}); read it again")
    log.info("pool %s changed: %s", name, sorted(changes), extra={"pool": name, "actor": principal.subject})
    return _answer(state, result.pool)


@admin_router.delete(
    "/{name}",
    status_code=204,
    responses=responses(401, 403, 404, 409, 503),
    summary="Delete a pool that no active job targets (its topic is kept: replays may still read it)",
)
async def delete_pool(name: PoolName, state: State, principal: Authenticated) -> Response:
    _admin(principal)
    result = await state.stores.pools.delete_pool(name)
    if not result.found:
        raise ProblemError(404, f"pool {name} is not registered")
    if not result.deleted:
        raise ProblemError(
            409,
            f"pool {name} still has {result.active_jobs} active jobs (ACTIVE or PAUSED); cancel them or move them "
            "to another pool first",
        )
    state.pool_cache.forget(name)
    log.info("pool %s deleted", name, extra={"pool": name, "actor": principal.subject})
    return Response(status_code=204)
