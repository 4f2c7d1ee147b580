"""``/v1/jobs``: register, read, change, pause, resume, trigger, page through and cancel jobs.

What a job body defines, and how it is validated, is :mod:`sundial_api.job_definition`'s; previews of fires are
:mod:`sundial_api.job_preview`'s.

Creating a job is one INSERT statement (tenant, job and audit row together, so nothing is ever half
written), then — only if it is due within the hot window — one ZADD; concurrent creates share that statement
and that commit (:mod:`sundial_api.group_commit`), each still answered on its own. Postgres is the truth (DESIGN
invariant 1): if the ZADD fails the job is still accepted, and the hydrator's overdue scan puts it in
the window. Every other change is one compare-and-set statement, then the job's hot-window member is
moved to where the job now says it belongs (or removed).

A job's ``version`` is its ETag: responses carry ``ETag: "<version>"`` and ``PATCH`` honours ``If-Match``
(412 when the job has changed since), so two editors never silently overwrite each other.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Body, Header, Path, Query
from redis.exceptions import RedisError
from starlette.responses import Response
from sundial_common.domain import ids
from sundial_common.domain.schedules import fire_at, spec_from_row
from sundial_common.observability import tracing
from sundial_common.security.auth import Principal
from sundial_common.security.encryption import TenantCipher
from sundial_common.stores.dependencies import GraphError
from sundial_common.stores.jobs import JobKeyTaken
from sundial_common.stores.tenants import ActiveJobsQuotaExceeded
from sundial_common.stores.types import Occurrence, Record

from sundial_api import idempotency, job_keys
from sundial_api.auth import Authenticated
from sundial_api.create_route import CreateRoute
from sundial_api.group_commit import HOT_WINDOW_MARGIN
from sundial_api.job_definition import (
    as_body,
    check_payload,
    definition,
    edges_of,
    graph_problem,
    merged,
    resolve,
    with_tenant_defaults,
)
from sundial_api.job_detail import etag, job_detail
from sundial_api.json_body import JsonRoute
from sundial_api.metrics import count_created
from sundial_api.models.executions import ExecutionPage, render_execution
from sundial_api.models.jobs import Job, JobCreate, JobDetail, JobPatch, JobState, Triggered, render_job
from sundial_api.models.schedules import (
    SCHEDULE_FIELDS,
    JobType,
)
from sundial_api.pagination import InvalidCursor, decode_cursor, encode_cursor
from sundial_api.pool_workers import job_warnings
from sundial_api.pools import usable_pool, with_pool_defaults
from sundial_api.problems import (
    ProblemError,
    field_error,
    invalid,
    not_found,
    parse_resource_id,
    responses,
)
from sundial_api.responses import OrjsonResponse
from sundial_api.schedule import Resolved
from sundial_api.state import ApiState, State
from sundial_api.tenants import QuotaExceededError, check_create_rate

log = logging.getLogger("sundial.api")

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=JsonRoute)
#: ``POST /v1/jobs`` alone: its endpoint is called directly (:mod:`sundial_api.create_route`).
create_router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=CreateRoute)

JobId = Annotated[str, Path(description="The job's id (a UUID). Unknown, malformed or another tenant's: 404.")]


@create_router.post(
    "",
    status_code=201,
    response_model=Job,
    responses=responses(401, 403, 413, 422, 429, 503),
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
            description="Makes a retried create safe (kept 24 h per tenant, 1-255 visible ASCII characters): the "
            "same key with the same body answers what the first request answered and registers nothing more; with "
            "another body, 422; while the first request still runs, 409.",
        ),
    ] = None,
) -> Response:
    """Validate the job, compute its first fire time, store it, and put it in the hot window if it is due soon.

    Fails with 422 naming the field for any invalid input, 413 for a `payload` over the limit; nothing is
    written when the request fails. A `key` already registered answers that job (200) for the same body, else 409.
    """
    settings = state.settings
    check_payload(body.payload, settings.max_payload_bytes)
    tenant = await state.tenant_cache.get(principal.tenant)
    asked = body
    pool = await usable_pool(state, principal.tenant, body.target.pool, "target.pool")
    body = with_pool_defaults(with_tenant_defaults(body, tenant), pool)
    now = state.clock.now()
    edges = edges_of(body)
    resolved = resolve(body, state, now)
    assert resolved.next_nominal is not None or edges  # a new job always has an occurrence (else 422 above)
    await check_create_rate(state, tenant)
    max_active_jobs = tenant.quotas.max_active_jobs if tenant is not None else None

    job_id = ids.new_id()
    shard = ids.shard_for(job_id, settings.shards)
    cipher = await state.keyring.cipher(principal.tenant)
    if (already := await job_keys.registered(state, principal, asked, cipher)) is not None:
        return already  # the key's job, or 409: nothing written
    values = definition(body, resolved, settings.default_timeout_sec, cipher) | job_keys.key_columns(asked)
    # Accepted all the same (workers may be deployed after their jobs); part of a replayed answer too.
    warnings = await job_warnings(state, body.target.pool, body.target.handler)
    values.update(
        {
            "id": job_id,
            "tenant_id": principal.tenant,
            "state": JobState.ACTIVE.value,
            "shard": shard,
            "next_nominal_at": resolved.next_nominal,
            "next_fire_at": fire_at(job_id, resolved.next_nominal, body.jitter_sec) if resolved.next_nominal else None,
            # The request span's context: the dispatch and the handler run continue this trace.
            "traceparent": tracing.traceparent(),
        }
    )
    try:
        if idempotency_key is not None:
            created = await idempotency.create_job_once(
                state,
                principal,
                idempotency_key,
                asked,
                values,
                cipher,
                max_active_jobs=max_active_jobs,
                parents=edges,
                warnings=warnings,
            )
            if isinstance(created, Response):
                return created  # the first request's answer, replayed
            row = created
        elif edges:
            row = await state.stores.dependencies.create_dependent_job(
                values, edges, actor=principal.subject, max_active_jobs=max_active_jobs
            )
        elif max_active_jobs is None and body.key is None:
            # Written with the creates running beside it, in one statement; near-due, it is in the hot window.
            row = await state.create_groups.create(values, principal.subject)
        else:  # the quota's count and lock belong to one transaction per create; a key's clash fails one create
            row = await state.stores.jobs.insert_job(values, actor=principal.subject, max_active_jobs=max_active_jobs)
    except ActiveJobsQuotaExceeded as exc:
        raise QuotaExceededError("maxActiveJobs", exc.limit, exc.current) from None
    except GraphError as exc:
        raise graph_problem(exc) from None
    except JobKeyTaken:
        return await job_keys.lost_race(state, principal, asked, cipher)
    count_created(((row["tenant_id"], row["type"]),))
    if idempotency_key is not None or edges or max_active_jobs is not None or body.key is not None:
        await _sync_hot_window(state, row, principal.tenant, removing=False)
    log.debug("job created", extra={"tenant": principal.tenant, "job_id": job_id, "shard": shard})
    view = render_job(row, cipher, body.payload)
    if warnings:
        view["warnings"] = warnings
    return OrjsonResponse(
        view,
        status_code=201,
        headers={"Location": f"/v1/jobs/{job_id}", **etag(row)},
    )


async def _sync_hot_window(state: ApiState, row: Record, tenant: str, *, removing: bool = True) -> None:
    """Put the job's hot-window member where the job now says it belongs: its next fire if it is active,
    or a pending trigger; nowhere if neither is due within the hot window (the hydrator promotes later
    ones). Best effort: Postgres has the truth, and the hydrator's scans repair a failed write.
    """
    candidates = [row["trigger_at"]]
    if row["state"] == JobState.ACTIVE:
        candidates.append(row["next_fire_at"])
    due = min((c for c in candidates if c is not None), default=None)
    horizon = state.clock.now() + timedelta(seconds=state.settings.hot_window_sec) + HOT_WINDOW_MARGIN
    try:
        if due is not None and due < horizon:
            await state.hot_window.add(row["shard"], [Occurrence(row["id"], due)])
        elif removing:
            await state.hot_window.remove(row["shard"], [row["id"]])
    except (RedisError, OSError) as exc:
        log.warning(
            "job stored but its hot-window member not updated (the hydrator will repair it): %r",
            exc,
            extra={"tenant": tenant, "job_id": row["id"], "shard": row["shard"]},
        )


@router.get(
    "/{job_id}",
    response_model=JobDetail,
    responses=responses(401, 404, 503),
    summary="Read a job and its latest executions",
)
async def get_job(job_id: JobId, state: State, principal: Authenticated) -> Response:
    return await job_detail(state, principal, parse_resource_id("job", job_id), job_id)


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
        state.stores.jobs.get_job(principal.tenant, ident),
        state.stores.executions.page_executions(ident, after, limit + 1),
    )
    if job is None:
        raise not_found("job", job_id)
    page = rows[:limit]
    next_cursor = encode_cursor(page[-1]["scheduled_for"], page[-1]["id"]) if len(rows) > limit else None
    template = state.settings.trace_link
    cipher = await state.keyring.cipher(principal.tenant)
    items = [render_execution(row, template, cipher) for row in page]
    return OrjsonResponse({"items": items, "nextCursor": next_cursor})


@router.delete(
    "/{job_id}",
    response_model=Job,
    responses=responses(401, 404, 409, 503),
    summary="Cancel a job",
    response_description="The job, now CANCELLED.",
)
async def cancel_job(
    job_id: JobId,
    state: State,
    principal: Authenticated,
    cascade: Annotated[
        bool, Query(description="Also cancel the DEPENDENT jobs that run after this one (children, theirs, …).")
    ] = False,
) -> Response:
    """Stop all future fires. Idempotent: cancelling a cancelled job answers 200 again.

    A job that already fired for the last time (COMPLETED) has nothing left to cancel: 409. Executions
    already dispatched are not stopped here (`POST /v1/executions/{id}/cancel` will do that). A job that
    DEPENDENT jobs still wait on (ACTIVE or PAUSED children): 409 naming them, nothing changed, unless
    `cascade=true`, which cancels them too.
    """
    ident = parse_resource_id("job", job_id)
    live = await state.stores.dependencies.live_descendants(ident)
    if live and not cascade:
        if await state.stores.jobs.get_job(principal.tenant, ident) is None:
            raise not_found("job", job_id)
        names = ", ".join(f"{r['id']} ({r['name']})" for r in live[:20]) + (" …" if len(live) > 20 else "")
        raise ProblemError(
            409,
            f"job {job_id} has {len(live)} dependent jobs that would never run again: {names}. Delete them first, "
            "or ask for `cascade=true`",
            slug="job-has-children",
        )
    row = await state.stores.jobs.cancel_job(principal.tenant, ident, actor=principal.subject)
    if row is not None and live:
        await state.stores.dependencies.cancel_with_descendants(principal.tenant, ident, actor=principal.subject)
    if row is None:
        row = await state.stores.jobs.get_job(principal.tenant, ident)
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
    return OrjsonResponse(render_job(row, await state.keyring.cipher(principal.tenant)))


# --- lifecycle: pause, resume, trigger, change ----------------------------------------------------------


async def _existing(state: ApiState, tenant: str, ident: UUID, job_id: str) -> Record:
    row = await state.stores.jobs.get_job(tenant, ident)
    if row is None:
        raise not_found("job", job_id)
    return row


@router.post(
    "/{job_id}/pause",
    response_model=Job,
    responses=responses(401, 404, 409, 503),
    summary="Pause a job: no fires until it is resumed",
)
async def pause_job(job_id: JobId, state: State, principal: Authenticated) -> Response:
    """ACTIVE → PAUSED: the job leaves the hot window and fires no more; executions already dispatched go on.

    Idempotent (pausing a paused job answers 200 again); a COMPLETED or CANCELLED job: 409. The job keeps
    its next occurrence, so `resume` can apply the catch-up policy to what was missed meanwhile.
    """
    return await _transition(
        state, principal, job_id, state.stores.jobs.pause_job, JobState.PAUSED, "an ACTIVE job can be paused"
    )


@router.post(
    "/{job_id}/resume",
    response_model=Job,
    responses=responses(401, 404, 409, 503),
    summary="Resume a paused job",
)
async def resume_job(job_id: JobId, state: State, principal: Authenticated) -> Response:
    """PAUSED → ACTIVE. The occurrences that came due while it was paused go to the catch-up policy at once:
    those at most `catchupWindowSec` late run as usual; older ones were missed — `FIRE_ONCE` runs one for
    them, `FIRE_ALL` each, `SKIP` none (counted in `missedFires`). Then the schedule carries on from now.

    Idempotent (resuming an active job answers 200 again); a COMPLETED or CANCELLED job: 409.
    """
    return await _transition(
        state, principal, job_id, state.stores.jobs.resume_job, JobState.ACTIVE, "a PAUSED job can be resumed"
    )


async def _transition(
    state: ApiState,
    principal: Principal,
    job_id: str,
    change: Callable[..., Awaitable[Record | None]],
    target: JobState,
    rule: str,
) -> Response:
    """Apply a pause/resume CAS; already in ``target`` answers 200 again (idempotent), any other state 409."""
    ident = parse_resource_id("job", job_id)
    row = await change(principal.tenant, ident, actor=principal.subject)
    if row is None:
        row = await _existing(state, principal.tenant, ident, job_id)
        if row["state"] != target:
            raise ProblemError(409, f"job {job_id} is {row['state']}: only {rule}")
    await _sync_hot_window(state, row, principal.tenant)
    return OrjsonResponse(render_job(row, await state.keyring.cipher(principal.tenant)), headers=etag(row))


@router.post(
    "/{job_id}/trigger",
    status_code=202,
    response_model=Triggered,
    responses=responses(401, 403, 404, 409, 422, 503),
    summary="Run a job once now, without moving its schedule",
    response_description="The run is accepted; `Location` points at its execution.",
)
async def trigger_job(job_id: JobId, state: State, principal: Authenticated) -> Response:
    """One extra run now — also for a PAUSED or COMPLETED job — that leaves the schedule as it is (it does not
    count against `maxRuns`). The dispatcher creates the execution within moments, with the id returned
    here. A trigger still pending is not doubled: asking again returns it. A CANCELLED job: 409.
    """
    ident = parse_resource_id("job", job_id)
    # The job's pool may have been given to another tenant since the job was created: a trigger is new work.
    job = await _existing(state, principal.tenant, ident, job_id)
    await usable_pool(state, principal.tenant, job["pool"], "target.pool", job_id=ident)
    execution_id = ids.new_id()
    at = state.clock.now()
    at = at.replace(microsecond=at.microsecond - at.microsecond % 1000)
    if at.microsecond == 0:
        # Cron occurrences fall on whole seconds, and (job, scheduledFor) is unique: keep clear of them.
        at += timedelta(milliseconds=1)
    row = await state.stores.jobs.trigger_job(
        principal.tenant, ident, at, execution_id, actor=principal.subject, traceparent=tracing.traceparent()
    )
    if row is None:
        row = await _existing(state, principal.tenant, ident, job_id)
        if row["trigger_execution_id"] is None:
            raise ProblemError(409, f"job {job_id} is {row['state']}: it cannot run again")
    else:
        await _sync_hot_window(state, row, principal.tenant)
    pending = row["trigger_execution_id"]
    return OrjsonResponse(
        {"jobId": str(row["id"]), "executionId": str(pending), "scheduledFor": row["trigger_at"]},
        status_code=202,
        headers={"Location": f"/v1/executions/{pending}"},
    )


def _if_match(header: str | None) -> int | None:
    """The version an ``If-Match`` header names (``"3"``, ``W/"3"`` or ``3``); None for absent or ``*``."""
    if header is None or header.strip() == "*":
        return None
    text = header.strip().removeprefix("W/").strip('"')
    if not text.isdigit():
        raise invalid("If-Match", f'`{header}` is not a job version; send the ETag of the job, e.g. "3"')
    return int(text)


def _change_detail(
    current: Record, values: Mapping[str, Any], changed: list[str], cipher: TenantCipher
) -> dict[str, Any]:
    """The audit detail of a PATCH: the fields it set, with their values before and after.

    A payload's value is never copied into the audit log (it may carry secrets, and is kept encrypted where the
    job is): that it changed is recorded, not what it became.
    """
    before, after = as_body(current, cipher), as_body({**current, **values}, cipher)
    shown = [name for name in changed if name != "payload"]
    return {
        "changed": changed,
        "before": {name: before.get(name) for name in shown},
        "after": {name: after.get(name) for name in shown},
    }


@router.patch(
    "/{job_id}",
    response_model=Job,
    responses=responses(401, 403, 404, 409, 412, 413, 422, 503),
    summary="Change a job",
)
async def update_job(
    job_id: JobId,
    body: Annotated[JobPatch, Body()],
    state: State,
    principal: Authenticated,
    if_match: Annotated[
        str | None,
        Header(
            alias="If-Match",
            description='The job\'s `version` (its ETag, e.g. `"3"`) this change is based on: if the job has '
            "changed since, nothing is written and the answer is 412. Without it the change applies to the "
            "current version.",
        ),
    ] = None,
) -> Response:
    """Change any field of an ACTIVE or PAUSED job (`null` clears an optional one).

    The job as changed is validated like a new one; a change to when it fires applies from the next
    occurrence after now, and executions already dispatched continue. A schedule that is over at once
    (`endAt` in the past, `maxRuns` already reached) leaves the job COMPLETED.
    """
    ident = parse_resource_id("job", job_id)
    expected = _if_match(if_match)
    patch = body.model_dump(by_alias=True, include=body.model_fields_set)
    if "payload" in patch:
        check_payload(patch["payload"], state.settings.max_payload_bytes)
    reschedule = bool(patch.keys() & SCHEDULE_FIELDS)
    cipher = await state.keyring.cipher(principal.tenant)
    await _patch_parents(state, principal, ident, job_id, patch, cipher)
    # A compare-and-set on the version and on the occurrence the change was computed from; a dispatch that
    # commits in between moves the occurrence, and the change is simply computed again.
    for _ in range(5):
        current = await _existing(state, principal.tenant, ident, job_id)
        if expected is not None and current["version"] != expected:
            raise ProblemError(
                412,
                f"job {job_id} is at version {current['version']}, not {expected}: read it again and retry",
                errors=[field_error("If-Match", f"the job is at version {current['version']}")],
                slug="precondition-failed",
                headers=etag(current),
            )
        if current["state"] not in (JobState.ACTIVE, JobState.PAUSED):
            raise ProblemError(409, f"job {job_id} is {current['state']}: only ACTIVE or PAUSED jobs change")
        changed = merged(current, patch, cipher)
        if "target" in patch:
            await usable_pool(state, principal.tenant, changed.target.pool, "target.pool", job_id=ident)
        now = state.clock.now()
        if reschedule:
            resolved = resolve(changed, state, now, runs=current["fire_count"])
            nominal = resolved.next_nominal
        else:
            resolved = Resolved(spec_from_row(current), current["next_nominal_at"] or current["next_fire_at"])
            nominal = resolved.next_nominal
        values = definition(changed, resolved, state.settings.default_timeout_sec, cipher)
        if changed.type is JobType.DELAYED and not reschedule:
            values["run_at"] = None
        values["next_nominal_at"] = nominal
        values["next_fire_at"] = fire_at(ident, nominal, changed.jitter_sec) if nominal is not None else None
        dependent = changed.type is JobType.DEPENDENT  # no clock: never COMPLETED by its schedule
        values["state"] = current["state"] if nominal is not None or dependent else JobState.COMPLETED.value
        row = await state.stores.jobs.update_job(
            current, values, actor=principal.subject, detail=_change_detail(current, values, sorted(patch), cipher)
        )
        if row is not None:
            await _sync_hot_window(state, row, principal.tenant)
            view = render_job(row, cipher)
            if "target" in patch and (warnings := await job_warnings(state, row["pool"], row["handler"])):
                view["warnings"] = warnings
            return OrjsonResponse(view, headers=etag(row))
    raise ProblemError(409, f"job {job_id} kept changing under this update; retry", headers={"Retry-After": "1"})


async def _patch_parents(
    state: ApiState, principal: Principal, ident: UUID, job_id: str, patch: Mapping[str, Any], cipher: TenantCipher
) -> None:
    """A PATCH touching the dependency graph: a job cannot become or stop being DEPENDENT (422); a new
    ``dependsOn`` replaces the parents, checked for cycles and limits, before the rest is written."""
    current = await _existing(state, principal.tenant, ident, job_id)
    new_type = patch.get("type")
    if new_type is not None and new_type != current["type"] and JobType.DEPENDENT in (new_type, current["type"]):
        raise invalid("type", "cannot change to or from DEPENDENT: create a new job instead")
    if "dependsOn" not in patch:
        return
    if current["type"] != JobType.DEPENDENT:
        raise invalid("dependsOn", f"is only for DEPENDENT jobs, not {current['type']}")
    if current["state"] not in (JobState.ACTIVE, JobState.PAUSED):
        raise ProblemError(409, f"job {job_id} is {current['state']}: only ACTIVE or PAUSED jobs change")
    body = merged(current, {"dependsOn": patch["dependsOn"]}, cipher)
    edges = edges_of(body)
    try:
        await state.stores.dependencies.replace_parents(principal.tenant, ident, edges, actor=principal.subject)
    except GraphError as exc:
        raise graph_problem(exc) from None
