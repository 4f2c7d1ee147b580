"""``/v1/executions``: one occurrence's whole story, the dead-letter view, cancelling and re-running one.

* ``GET /v1/executions/{id}`` — state, every attempt (worker, times, error, progress), trace. A manual run
  accepted by ``POST /v1/jobs/{id}/trigger`` and not created by its shard leader yet is answered from the
  job's pending trigger: PENDING, no attempt, ``fenceToken`` 0.
* ``GET /v1/executions`` — the tenant's executions, newest first, optionally by state, job, pool, handler,
  scheduled time or trace; ``?state=DEAD`` is the dead-letter queue as ops see it (the same executions are
  published to the ``sundial.dlq`` topic).
* ``POST /v1/executions/{id}/cancel`` — a PENDING execution (or one waiting for a retry) is CANCELLED at
  once and never starts; a RUNNING one is asked to stop — ``cancelRequestedAt`` in Postgres and the Redis
  flag ``sundial:cancel:<id>`` its worker polls — and its worker records CANCELLED (202). A finished one: 409.
* ``POST /v1/executions/{id}/retry`` — a DEAD execution gets one more attempt: it is scheduled now and goes
  through the hot window and the dispatcher like any retry (202).

Every change is one compare-and-swap statement with its audit row; Redis writes come after and are best
effort (the worker also reads cancel requests from Postgres, the hydrator re-adds a lost retry member).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Path, Query
from opentelemetry.trace import Link, get_current_span
from redis.exceptions import RedisError
from starlette.responses import Response
from sundial_common.hotwindow.execution_signals import CANCEL_KEY_TTL_SEC, cancel_key
from sundial_common.observability.tracing import execution_attributes, execution_context, tracer
from sundial_common.security.auth import Principal
from sundial_common.stores.executions import ExecutionFilter
from sundial_common.stores.types import Record, RetryDue

from sundial_api import stats
from sundial_api.auth import Authenticated
from sundial_api.models.executions import (
    Execution,
    ExecutionDetail,
    ExecutionList,
    ExecutionState,
    render_attempt,
    render_execution,
    render_pending_trigger,
)
from sundial_api.pagination import InvalidCursor, decode_id_cursor, encode_id_cursor
from sundial_api.pool_workers import execution_waiting_for
from sundial_api.problems import ProblemError, invalid, not_found, parse_resource_id, responses
from sundial_api.responses import OrjsonResponse
from sundial_api.state import ApiState, State

log = logging.getLogger("sundial.api")

router = APIRouter(prefix="/v1/executions", tags=["executions"])

ExecutionId = Annotated[
    str, Path(description="The execution's id (a UUID). Unknown, malformed or another tenant's: 404.")
]

_CURSOR_PREFIX = "x1"


def _decode_cursor(cursor: str) -> UUID:
    try:
        return decode_id_cursor(_CURSOR_PREFIX, cursor)
    except InvalidCursor as exc:
        raise invalid("cursor", str(exc)) from None


async def _view(state: ApiState, principal: Principal, row: Record) -> dict[str, object]:
    return render_execution(row, state.settings.trace_link, await state.keyring.cipher(principal.tenant))


@router.get(
    "",
    response_model=ExecutionList,
    responses=responses(401, 422, 503),
    summary="List executions, newest first: by state (e.g. the dead letters), job, pool, handler, time, or trace",
)
async def list_executions(
    state: State,
    principal: Authenticated,
    execution_state: Annotated[
        list[ExecutionState] | None,
        Query(
            alias="state",
            description="Only executions in this state (repeat for several); `DEAD` lists the dead letters.",
        ),
    ] = None,
    job_id: Annotated[str | None, Query(alias="jobId", description="Only this job's executions.")] = None,
    pool: Annotated[str | None, Query(max_length=63, description="Only executions delivered to this pool.")] = None,
    handler: Annotated[str | None, Query(max_length=128, description="Only executions of this handler.")] = None,
    scheduled_from: Annotated[
        datetime | None, Query(alias="scheduledFrom", description="Occurrences scheduled at or after.")
    ] = None,
    scheduled_to: Annotated[
        datetime | None, Query(alias="scheduledTo", description="Occurrences scheduled before.")
    ] = None,
    trace_id: Annotated[
        str | None,
        Query(
            alias="traceId",
            pattern="^[0-9a-f]{32}$",
            description="The executions of this trace (32 lowercase hex digits, as Jaeger shows it); "
            "with `state`, only those in that state.",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200, description="Page size.")] = 50,
    cursor: Annotated[
        str | None, Query(description="`nextCursor` of the previous page; omit for the first page.")
    ] = None,
) -> Response:
    """Every filter is optional; pages never repeat or skip an execution however many are created meanwhile."""
    before = _decode_cursor(cursor) if cursor is not None else None
    states = tuple(dict.fromkeys(s.value for s in execution_state)) if execution_state else None
    # One row more than the page tells whether another page exists without a count query.
    if trace_id is not None:
        if states is not None and len(states) > 1:
            raise invalid("state", "takes one state together with traceId")
        rows = await state.stores.executions.executions_of_trace(
            principal.tenant, trace_id, states[0] if states else None, before, limit + 1
        )
    else:
        where = ExecutionFilter(
            states=states,
            job_id=_job_filter(job_id),
            pool=pool,
            handler=handler,
            scheduled_from=_aware("scheduledFrom", scheduled_from),
            scheduled_to=_aware("scheduledTo", scheduled_to),
        )
        rows = await state.stores.executions.list_executions(principal.tenant, where, before, limit + 1)
    page = rows[:limit]
    next_cursor = encode_id_cursor(_CURSOR_PREFIX, page[-1]["id"]) if len(rows) > limit else None
    cipher = await state.keyring.cipher(principal.tenant)
    items = [render_execution(row, state.settings.trace_link, cipher) for row in page]
    return OrjsonResponse({"items": items, "nextCursor": next_cursor})


def _job_filter(raw: str | None) -> UUID | None:
    if raw is None:
        return None
    try:
        return UUID(raw)
    except ValueError:
        raise invalid("jobId", "is not a job id (a UUID)") from None


def _aware(name: str, value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        raise invalid(name, "needs an offset (RFC 3339, e.g. 2026-05-05T10:00:00Z)")
    return value


@router.get(
    "/{execution_id}",
    response_model=ExecutionDetail,
    responses=responses(401, 404, 410, 503),
    summary="Read an execution with its attempts and trace",
)
async def get_execution(execution_id: ExecutionId, state: State, principal: Authenticated) -> Response:
    ident = parse_resource_id("execution", execution_id)
    execution, attempts = await state.stores.executions.execution_with_attempts(principal.tenant, ident)
    if execution is None:
        trigger = await state.stores.jobs.pending_trigger(principal.tenant, ident)
        if trigger is not None:
            return OrjsonResponse(render_pending_trigger(trigger, state.settings.trace_link))
        # The leader creates the execution and clears its trigger in one transaction: a trigger gone between
        # the two reads above is an execution that exists now.
        execution, attempts = await state.stores.executions.execution_with_attempts(principal.tenant, ident)
    if execution is None:
        raise await stats.expired_execution(state, principal.tenant, ident) or not_found("execution", execution_id)
    cipher = await state.keyring.cipher(principal.tenant)
    view = render_execution(execution, state.settings.trace_link, cipher)
    view["attempts"] = [render_attempt(row, cipher) for row in attempts]
    view["waitingFor"] = await execution_waiting_for(state, execution["pool"], execution["state"])
    return OrjsonResponse(view)


def _trace_cancel(row: Record) -> None:
    """The cancel request as a span in the execution's own trace, linked to this HTTP request's span."""
    request = get_current_span().get_span_context()
    with tracer.start_as_current_span(
        "cancel",
        context=execution_context(row["traceparent"]),
        links=[Link(request)] if request.is_valid else [],
        attributes={
            **execution_attributes(
                tenant=row["tenant_id"], job_id=row["job_id"], execution_id=row["id"], attempt=row["attempt"]
            ),
            "sundial.from_state": row["from_state"],
            "sundial.state": row["state"],
        },
    ):
        pass


@router.post(
    "/{execution_id}/cancel",
    response_model=Execution,
    responses={
        202: {"model": Execution, "description": "RUNNING: its worker has been asked to stop it."},
        **responses(401, 404, 409, 503),
    },
    summary="Cancel an execution",
    response_description="PENDING or waiting for a retry: now CANCELLED.",
)
async def cancel_execution(execution_id: ExecutionId, state: State, principal: Authenticated) -> Response:
    """A PENDING execution, or one waiting for its next attempt, is CANCELLED at once (200) and never starts.
    A RUNNING one is asked to stop (202, `cancelRequestedAt` set): its handler sees `ctx.cancelled` within a
    second and is interrupted; the worker records CANCELLED (a handler that ignores it is abandoned after a
    grace period). Asking again is harmless. A finished execution cannot be cancelled: 409.
    """
    ident = parse_resource_id("execution", execution_id)
    row = await state.stores.executions.cancel_execution(principal.tenant, ident, actor=principal.subject)
    if row is None:
        current = await state.stores.executions.get_execution(principal.tenant, ident)
        if current is None:
            raise not_found("execution", execution_id)
        raise ProblemError(409, f"execution {execution_id} is {current['state']}: it has finished, nothing to cancel")
    _trace_cancel(row)
    if row["state"] != "RUNNING":
        return OrjsonResponse(await _view(state, principal, row))
    try:
        await state.hot_window.redis.set(cancel_key(ident), "1", ex=CANCEL_KEY_TTL_SEC)
    except (RedisError, OSError) as exc:
        # Postgres has the request; the worker reads it from there at its next heartbeat instead.
        log.warning(
            "cancel of a running execution recorded, but its Redis flag not set: %r",
            exc,
            extra={"tenant": principal.tenant, "execution_id": ident},
        )
    return OrjsonResponse(await _view(state, principal, row), status_code=202)


@router.post(
    "/{execution_id}/retry",
    status_code=202,
    response_model=Execution,
    responses=responses(401, 404, 409, 503),
    summary="Run a DEAD execution once more",
    response_description="Its next attempt is scheduled now (`nextAttemptAt`); `Location` points at it.",
)
async def retry_execution(execution_id: ExecutionId, state: State, principal: Authenticated) -> Response:
    """A DEAD execution (it used up its attempts) gets one more: the dispatcher starts it within moments, with
    the next attempt number, and it runs as any attempt does (a failure makes it DEAD again). Asking again
    while that attempt is scheduled answers the same. Any other state: 409.
    """
    ident = parse_resource_id("execution", execution_id)
    row = await state.stores.executions.retry_dead_execution(principal.tenant, ident, actor=principal.subject)
    if row is None:
        current = await state.stores.executions.get_execution(principal.tenant, ident)
        if current is None:
            raise not_found("execution", execution_id)
        if current["state"] != "DEAD" or current["next_attempt_at"] is None:
            raise ProblemError(409, f"execution {execution_id} is {current['state']}: only a DEAD one can be retried")
        row = current  # its retry is already scheduled
    else:
        try:
            await state.hot_window.add_retries(row["shard"], [RetryDue(ident, row["next_attempt_at"])])
        except (RedisError, OSError) as exc:
            log.warning(
                "retry scheduled, but its hot-window member not added (the hydrator will): %r",
                exc,
                extra={"tenant": principal.tenant, "execution_id": ident},
            )
    return OrjsonResponse(
        await _view(state, principal, row), status_code=202, headers={"Location": f"/v1/executions/{ident}"}
    )
