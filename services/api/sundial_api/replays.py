"""``/v1/replays``: replay a window of a pool's Kafka messages into a staging pool, and follow it.

* ``POST /v1/replays`` — validate and record the request (202, PENDING); the replayer
  (``sundial replayer``) resolves the window to offsets, re-publishes and counts. Bad requests create
  nothing: ``from >= to`` or a window in the future (422), a target that is the source, not registered or not a
  ``staging`` pool in the registry (422), a target the caller's tenant may not use (403, as for any work sent
  into a pool; an admin token may target any staging pool), an unknown source pool (404, its topic does not
  exist), a window older than the topic keeps (409, naming
  the earliest instant still available). A tenant's token replays only that tenant's messages (the filter's
  ``tenantId`` is forced to it; naming another is 403); an admin token may replay a whole pool.
* ``GET /v1/replays/{id}``, ``GET /v1/replays`` (newest first, cursor pages) — state, per-partition offsets
  and progress, counts. A tenant sees its own replays; an admin sees every replay.
* ``POST /v1/replays/{id}/cancel`` — a PENDING replay is CANCELLED at once; a RUNNING one stops at its next
  batch (202). A finished one: 409.
* ``GET /v1/replays/{id}/runs`` — what the staging workers did with each replayed message.

The router brings its own lifespan (merged into the app's): the Kafka topic inspector the validation reads.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Annotated
from uuid import UUID

from confluent_kafka import KafkaException
from fastapi import APIRouter, FastAPI, Path, Query, Request
from starlette.responses import Response
from sundial_common.broker.messages import POOL_NAME, pool_topic
from sundial_common.broker.topic_windows import KafkaTopicInspector, TopicInspector
from sundial_common.security.auth import Principal
from sundial_common.stores import replays as replay_store
from sundial_common.stores.types import Record

from sundial_api.auth import Authenticated
from sundial_api.json_body import JsonRoute
from sundial_api.models.replays import NewReplay, Replay, ReplayList, ReplayRunList, render_replay, render_run
from sundial_api.operations import (
    IdempotencyKey,
    cancel_status,
    cancelled,
    checked_key,
    created_headers,
    cursor_fields,
    existing,
    page_of,
    page_start,
)
from sundial_api.pagination import encode_token
from sundial_api.pools import refused, usable_pool
from sundial_api.problems import ProblemError, field_error, invalid, not_found, responses
from sundial_api.responses import OrjsonResponse
from sundial_api.state import ApiState, State

_CURSOR_PREFIX = "r1"
_RUNS_CURSOR = re.compile(r"^rr1:(\d{1,10}):(\d{1,19})$")


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    inspector = KafkaTopicInspector(app.state.api.settings.kafka_bootstrap)
    app.state.replay_topics = inspector
    try:
        yield
    finally:
        await inspector.close()


router = APIRouter(prefix="/v1/replays", tags=["replays"], lifespan=_lifespan, route_class=JsonRoute)

ReplayId = Annotated[str, Path(description="The replay's id (a UUID). Unknown, malformed or another tenant's: 404.")]


def _scope(principal: Principal) -> str | None:
    """Whose replays the caller sees: its tenant's, or (an admin) everyone's."""
    return None if principal.admin else principal.tenant


async def _view(state: ApiState, rows: Sequence[Record]) -> list[dict[str, object]]:
    partitions = await state.stores.replays.replay_partitions([r["id"] for r in rows]) if rows else []
    by_replay: dict[UUID, list[Record]] = {}
    for part in partitions:
        by_replay.setdefault(part["replay_id"], []).append(part)
    return [render_replay(r, by_replay.get(r["id"], [])) for r in rows]


async def _validated(
    state: ApiState,
    body: NewReplay,
    principal: Principal,
    topics: TopicInspector,
    idempotency_key: str | None,
    key_hash: bytes | None,
) -> tuple[Record, bool]:
    now = state.clock.now()
    if body.window_from >= body.window_to:
        raise invalid("to", "must be after `from`")
    if body.window_to > now:
        raise invalid("to", f"is in the future (now is {now.isoformat()}): only published messages can be replayed")
    for field, pool in (("sourcePool", body.source_pool), ("targetPool", body.target_pool)):
        if not POOL_NAME.fullmatch(pool):
            raise invalid(field, "is not a pool name (1-63 of a-z, 0-9, '.', '_', '-')")
    if body.target_pool == body.source_pool:
        raise invalid("targetPool", "must differ from `sourcePool`: a replay never writes to the pool it reads")
    tenant = body.filter.tenant_id
    if principal.admin:  # an operator may replay into any staging pool
        target = await state.pool_cache.get(body.target_pool) or await state.pool_cache.recheck(body.target_pool)
        if target is None:
            raise invalid("targetPool", f"names pool `{body.target_pool}`, which is not registered")
    else:
        target = await usable_pool(state, principal.tenant, body.target_pool, "targetPool", replay_target=True)
    if not target.staging:
        refused("not_staging", tenant=principal.tenant, pool=body.target_pool, field="targetPool")
        raise invalid("targetPool", f"must be a staging pool (pool `{body.target_pool}` is {target.kind})")
    if not principal.admin:
        if tenant is not None and tenant != principal.tenant:
            raise ProblemError(
                403,
                "a tenant's token replays only its own messages: `filter.tenantId` must be omitted or your tenant",
                errors=[field_error("filter.tenantId", f"must be {principal.tenant} (or omitted)")],
            )
        tenant = principal.tenant
    try:
        info = await topics.describe(pool_topic(body.source_pool), now)
    except KafkaException as exc:
        raise ProblemError(503, f"the broker did not answer: {exc}", headers={"Retry-After": "1"}) from None
    if info is None:
        raise not_found("pool", f"{body.source_pool} (no topic {pool_topic(body.source_pool)})")
    if info.earliest_available is not None and body.window_from < info.earliest_available:
        earliest = info.earliest_available.isoformat().replace("+00:00", "Z")
        raise ProblemError(
            409,
            f"the window starts before the oldest messages {pool_topic(body.source_pool)} still keeps; the earliest "
            f"`from` available is {earliest}",
            errors=[field_error("from", f"must be at or after {earliest}")],
        )
    return await state.stores.replays.insert_replay(
        replay_store.NewReplay(
            tenant_id=principal.tenant,
            created_by=principal.subject,
            source_pool=body.source_pool,
            target_pool=body.target_pool,
            window_from=body.window_from,
            window_to=body.window_to,
            filter_handler=body.filter.handler,
            filter_job_id=body.filter.job_id,
            filter_tenant_id=tenant,
            rate_per_sec=body.rate_per_sec,
            dry_run=body.dry_run,
            idempotency_key=idempotency_key,
            request_hash=key_hash,
        )
    )


@router.post(
    "",
    status_code=202,
    response_model=Replay,
    responses=responses(401, 403, 404, 409, 422, 503),
    summary="Replay a window of a pool's messages into a staging pool",
    response_description="Accepted (PENDING); `Location` points at the replay.",
)
async def create_replay(
    body: NewReplay,
    request: Request,
    state: State,
    principal: Authenticated,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Every message of `sourcePool`'s topic whose broker timestamp lies in `[from, to)` and that the filter
    selects is re-published into `targetPool`'s topic, with headers naming the replay and the original
    execution, topic, partition and offset. Production state is never touched."""
    key_hash = checked_key(idempotency_key, body)
    row, created = await _validated(state, body, principal, request.app.state.replay_topics, idempotency_key, key_hash)
    headers = created_headers(f"/v1/replays/{row['id']}", row, created, body, "replay")
    (view,) = await _view(state, [row])
    return OrjsonResponse(view, status_code=202, headers=headers)


@router.get("", response_model=ReplayList, responses=responses(401, 422, 503), summary="List replays, newest first")
async def list_replays(
    state: State,
    principal: Authenticated,
    limit: Annotated[int, Query(ge=1, le=200, description="Page size.")] = 50,
    cursor: Annotated[
        str | None, Query(description="`nextCursor` of the previous page; omit for the first page.")
    ] = None,
) -> Response:
    rows = await state.stores.replays.list_replays(_scope(principal), page_start(_CURSOR_PREFIX, cursor), limit + 1)
    page, next_cursor = page_of(_CURSOR_PREFIX, rows, limit)
    return OrjsonResponse({"items": await _view(state, page), "nextCursor": next_cursor})


@router.get("/{replay_id}", response_model=Replay, responses=responses(401, 404, 503), summary="Read a replay")
async def get_replay(replay_id: ReplayId, state: State, principal: Authenticated) -> Response:
    row = await existing("replay", replay_id, lambda ident: state.stores.replays.get_replay(ident, _scope(principal)))
    (view,) = await _view(state, [row])
    return OrjsonResponse(view)


@router.post(
    "/{replay_id}/cancel",
    response_model=Replay,
    responses={
        202: {"model": Replay, "description": "RUNNING: the replayer stops at its next batch."},
        **responses(401, 404, 409, 503),
    },
    summary="Cancel a replay",
    response_description="PENDING: now CANCELLED.",
)
async def cancel_replay(replay_id: ReplayId, state: State, principal: Authenticated) -> Response:
    scope = _scope(principal)
    row = await cancelled(
        "replay",
        replay_id,
        lambda ident: state.stores.replays.cancel_replay(ident, scope),
        lambda ident: state.stores.replays.get_replay(ident, scope),
        "it has finished, nothing to cancel",
    )
    (view,) = await _view(state, [row])
    return OrjsonResponse(view, status_code=cancel_status(row))


@router.get(
    "/{replay_id}/runs",
    response_model=ReplayRunList,
    responses=responses(401, 404, 422, 503),
    summary="What the staging workers did with the replayed messages",
)
async def replay_runs(
    replay_id: ReplayId,
    state: State,
    principal: Authenticated,
    limit: Annotated[int, Query(ge=1, le=1000, description="Page size.")] = 100,
    cursor: Annotated[
        str | None, Query(description="`nextCursor` of the previous page; omit for the first page.")
    ] = None,
) -> Response:
    row = await existing("replay", replay_id, lambda ident: state.stores.replays.get_replay(ident, _scope(principal)))
    after: tuple[int, int] | None = None
    if cursor is not None:
        partition, offset = cursor_fields(cursor, _RUNS_CURSOR)
        after = (partition, offset)
    rows = await state.stores.replays.list_runs(row["id"], after, limit + 1)
    page = rows[:limit]
    next_cursor = None
    if len(rows) > limit:
        last = page[-1]
        next_cursor = encode_token(f"rr1:{last['source_partition']}:{last['source_offset']}")
    return OrjsonResponse({"items": [render_run(r) for r in page], "nextCursor": next_cursor})
