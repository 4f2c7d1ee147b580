"""``/v1/jobs``: register, read, page through and cancel jobs.

Creating a job is one INSERT statement (tenant, job and audit row together, so nothing is ever half
written), then — only if it is due within the hot window — one ZADD. Postgres is the truth (DESIGN
invariant 1): if the ZADD fails the job is still accepted, and the hydrator's overdue scan puts it in
the window.
"""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import timedelta
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Header, Path, Query
from redis.exceptions import RedisError
from starlette.responses import Response
from sundial_common import ids, telemetry
from sundial_common.store import Occurrence

from sundial_api.auth import Authenticated
from sundial_api.models import ExecutionPage, Job, JobCreate, JobDetail, JobState, render_execution, render_job
from sundial_api.pagination import InvalidCursor, decode_cursor, encode_cursor
from sundial_api.problems import (
    ProblemError,
    field_error,
    invalid,
    not_found,
    parse_resource_id,
    responses,
)
from sundial_api.responses import OrjsonResponse
from sundial_api.schedule import ScheduleError, first_fire
from sundial_api.state import State

log = logging.getLogger("sundial.api")

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

LATEST_EXECUTIONS = 10
# Also add occurrences due a little past the horizon: a hydrator pass that read Postgres before this
# job committed may already have moved its watermark past it (or run on a clock slightly ahead). A
# member a minute beyond the window costs nothing; a missed one would fire only at the overdue scan.
_HOT_WINDOW_MARGIN = timedelta(seconds=60)

# An escaped NUL in JSON text: ``\u0000`` after an even number of backslashes, none included (after an odd
# run it is the literal text "\u0000", which is fine). jsonb refuses the NUL character.
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")

JobId = Annotated[str, Path(description="The job's id (a UUID). Unknown, malformed or another tenant's: 404.")]


@router.post(
    "",
    status_code=201,
    response_model=Job,
    responses=responses(401, 413, 422, 503),
    summary="Register a job",
    response_description="The job as stored; `Location` points at it.",
)
async def create_job(
    body: JobCreate,
    state: State,
    principal: Authenticated,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="Reserved: a later release makes a retried create with the same key return the first "
            "job instead of registering a second. Accepted and ignored for now.",
        ),
    ] = None,
) -> Response:
    """Validate the job, compute its first fire time, store it, and put it in the hot window if it is due soon.

    Fails with 422 naming the field for any invalid input, 413 for a `payload` over the limit; nothing is
    written when the request fails.
    """
    settings = state.settings
    # Valid JSON that Postgres' jsonb cannot hold must be a 422 here, not a 500 at the INSERT.
    try:
        payload_json = orjson.dumps(body.payload)
    except orjson.JSONEncodeError as exc:  # integers beyond 64 bits, nesting deeper than 255
        raise invalid("payload", f"cannot be stored: {exc}") from None
    if b"\\u0000" in payload_json and _NUL_ESCAPE.search(payload_json):
        raise invalid("payload", "cannot contain the NUL character (\\u0000)")
    payload_size = len(payload_json)
    if payload_size > settings.max_payload_bytes:
        message = f"is {payload_size} bytes as JSON; at most {settings.max_payload_bytes} are accepted"
        raise ProblemError(413, f"`payload` {message}", errors=[field_error("payload", message)])

    now = state.clock.now()
    try:
        first = first_fire(
            body.type,
            run_at=body.run_at,
            delay_seconds=body.delay_seconds,
            zone=body.timezone,
            now=now,
            grace_sec=settings.run_at_grace_sec,
        )
    except ScheduleError as exc:
        raise invalid(exc.field, exc.message) from None

    job_id = ids.new_id()
    shard = ids.shard_for(job_id, settings.shards)
    values: dict[str, Any] = {
        "id": job_id,
        "tenant_id": principal.tenant,
        "name": body.name,
        "type": body.type.value,
        "timezone": body.timezone,
        "run_at": first.run_at,
        "delay_seconds": body.delay_seconds,
        "pool": body.target.pool,
        "handler": body.target.handler,
        "payload": body.payload,
        # camelCase, as the client wrote it and as the dispatcher reads it (``maxAttempts``).
        "retry_policy": body.retry_policy.model_dump(mode="json", by_alias=True),
        "timeout_sec": body.timeout_sec if body.timeout_sec is not None else settings.default_timeout_sec,
        "priority": body.priority.value,
        "state": JobState.ACTIVE.value,
        "shard": shard,
        "next_fire_at": first.next_fire_at,
        # The request span's context: the dispatch and the handler run continue this trace.
        "traceparent": telemetry.traceparent(),
    }
    row = await state.store.insert_job(values, actor=principal.subject)

    if first.next_fire_at < now + timedelta(seconds=settings.hot_window_sec) + _HOT_WINDOW_MARGIN:
        try:
            await state.hot_window.add(shard, [Occurrence(job_id, first.next_fire_at)])
        except (RedisError, OSError) as exc:
            log.warning(
                "job stored but not added to the hot window (the hydrator will add it): %r",
                exc,
                extra={"tenant": principal.tenant, "job_id": job_id, "shard": shard},
            )
    log.debug("job created", extra={"tenant": principal.tenant, "job_id": job_id, "shard": shard})
    return OrjsonResponse(render_job(row), status_code=201, headers={"Location": f"/v1/jobs/{job_id}"})


@router.get(
    "/{job_id}",
    response_model=JobDetail,
    responses=responses(401, 404, 503),
    summary="Read a job and its latest executions",
)
async def get_job(job_id: JobId, state: State, principal: Authenticated) -> Response:
    ident = parse_resource_id("job", job_id)
    # Both reads at once; the executions are discarded unless the job is this tenant's.
    job, executions = await asyncio.gather(
        state.store.get_job(principal.tenant, ident), state.store.latest_executions(ident, LATEST_EXECUTIONS)
    )
    if job is None:
        raise not_found("job", job_id)
    template = state.settings.trace_link_template
    view = render_job(job)
    view["latestExecutions"] = [render_execution(row, template) for row in executions]
    return OrjsonResponse(view)


@router.get(
    "/{job_id}/executions",
    response_model=ExecutionPage,
    responses=responses(401, 404, 422, 503),
    summary="Page through a job's executions, newest first",
)
async def list_executions(
    job_id: JobId,
    state: State,
    principal: Authenticated,
    limit: Annotated[int, Query(ge=1, le=200, description="Page size.")] = 50,
    cursor: Annotated[
        str | None, Query(description="`nextCursor` of the previous page; omit for the first page.")
    ] = None,
) -> Response:
    ident = parse_resource_id("job", job_id)
    after = None
    if cursor is not None:
        try:
            after = decode_cursor(cursor)
        except InvalidCursor as exc:
            raise invalid("cursor", str(exc)) from None
    # One row more than the page tells whether another page exists without a count query.
    job, rows = await asyncio.gather(
        state.store.get_job(principal.tenant, ident), state.store.page_executions(ident, after, limit + 1)
    )
    if job is None:
        raise not_found("job", job_id)
    page = rows[:limit]
    next_cursor = encode_cursor(page[-1]["scheduled_for"], page[-1]["id"]) if len(rows) > limit else None
    template = state.settings.trace_link_template
    return OrjsonResponse({"items": [render_execution(row, template) for row in page], "nextCursor": next_cursor})


@router.delete(
    "/{job_id}",
    response_model=Job,
    responses=responses(401, 404, 409, 503),
    summary="Cancel a job",
    response_description="The job, now CANCELLED.",
)
async def cancel_job(job_id: JobId, state: State, principal: Authenticated) -> Response:
    """Stop all future fires. Idempotent: cancelling a cancelled job answers 200 again.

    A job that already fired for the last time (COMPLETED) has nothing left to cancel: 409. Executions
    already dispatched are not stopped here (`POST /v1/executions/{id}/cancel` will do that).
    """
    ident = parse_resource_id("job", job_id)
    row = await state.store.cancel_job(principal.tenant, ident, actor=principal.subject)
    if row is None:
        row = await state.store.get_job(principal.tenant, ident)
        if row is None:
            raise not_found("job", job_id)
        if row["state"] != JobState.CANCELLED:
            raise ProblemError(409, f"job {job_id} is {row['state']}: it has no future fires to cancel")
    # Also on a repeated cancel, in case the first one's ZREM failed. A stale member would be harmless
    # anyway (the dispatcher only fires ACTIVE jobs), but it would cost the dispatcher a lookup.
    try:
        await state.hot_window.remove(row["shard"], [ident])
    except (RedisError, OSError) as exc:
        log.warning(
            "job cancelled but its hot-window member was not removed: %r",
            exc,
            extra={"tenant": principal.tenant, "job_id": ident},
        )
    return OrjsonResponse(render_job(row))
