"""`POST /v1/jobs:batch`: register up to 1,000 jobs in one request, with a result per item.

Tenant services register in bulk (a nightly import, a fan-out of reminders). Each item is validated
exactly like a single `POST /v1/jobs`; the valid ones are written in ONE statement and put into the
hot window with one call per shard, the invalid ones come back as problem documents naming their
field. An item accepted answers the warnings a single create would (a handler no live worker of its pool
serves). One bad item never rejects the others; nothing is written for an invalid item. A ``DEPENDENT`` item is
refused (422 naming ``type``): its parents are checked and written with it, a job at a time, by ``POST /v1/jobs``.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Header
from pydantic import ValidationError
from starlette.responses import Response
from sundial_common.domain import ids
from sundial_common.domain.schedules import fire_at
from sundial_common.observability import tracing
from sundial_common.stores.pools import Pool
from sundial_common.stores.types import Record

from sundial_api import idempotency
from sundial_api.auth import Authenticated
from sundial_api.create_route import CreateRoute
from sundial_api.group_commit import HOT_WINDOW_MARGIN, add_near_due
from sundial_api.job_definition import check_payload, definition, resolve, with_tenant_defaults
from sundial_api.metrics import count_created
from sundial_api.models.batch import JobBatch
from sundial_api.models.jobs import JobCreate, JobState, render_job
from sundial_api.models.schedules import JobType
from sundial_api.pool_workers import job_warnings
from sundial_api.pools import usable_pool, with_pool_defaults
from sundial_api.problems import ProblemError, describe, invalid, problem_body, responses
from sundial_api.responses import OrjsonResponse
from sundial_api.schedule import Resolved
from sundial_api.state import State
from sundial_api.tenants import QuotaExceededError, rate_limited, take_creates

log = logging.getLogger("sundial.api")

router = APIRouter(prefix="/v1", tags=["jobs"], route_class=CreateRoute)


@router.post(
    "/jobs:batch",
    status_code=200,
    responses=responses(401, 413, 422, 503),
    summary="Register up to 1,000 jobs",
    response_description="`results[i]` answers `jobs[i]`: `status` 201 with the `job`, or 4xx with a `problem`.",
)
async def create_jobs(
    body: JobBatch,
    state: State,
    principal: Authenticated,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="As for `POST /v1/jobs`: the same key with the same body answers the first answer again and "
            "registers nothing more; another body, 422; while the first still runs, 409.",
        ),
    ] = None,
) -> Response:
    """Validate every item as a single create would; store the valid ones together."""
    settings = state.settings
    now = state.clock.now()
    tenant = await state.tenant_cache.get(principal.tenant)
    results: list[dict[str, Any]] = [{} for _ in body.jobs]
    accepted: list[tuple[int, dict[str, Any]]] = []
    payloads: dict[int, Any] = {}
    traceparent = tracing.traceparent()
    cipher = await state.keyring.cipher(principal.tenant)
    # Items of a batch often share a schedule (a fan-out due at one instant) and a pool: each distinct one is
    # resolved and checked once. Only successes are kept, so every failing item still gets its own problem.
    schedules: dict[tuple[Any, ...], Resolved] = {}
    pools: dict[str, Pool] = {}
    targets: dict[int, tuple[str, str]] = {}
    for index, raw in enumerate(body.jobs):
        try:
            job = with_tenant_defaults(JobCreate.model_validate(raw), tenant)
            if job.key is not None:
                # One statement writes the batch: a key's clash would fail every item with it.
                raise invalid("key", "is not accepted in a batch: create a job with a key with POST /v1/jobs")
            if job.type is JobType.DEPENDENT:
                # Its parents are locked, checked for cycles and written with it, one job per transaction.
                raise invalid("type", "DEPENDENT jobs are not created in a batch: create each with POST /v1/jobs")
            check_payload(job.payload, settings.max_payload_bytes)
            key = _schedule_key(job)
            resolved = schedules.get(key) if key is not None else None
            if resolved is None:
                resolved = resolve(job, state, now)
                if key is not None:
                    schedules[key] = resolved
            pool = pools.get(job.target.pool)
            if pool is None:
                pool = await usable_pool(state, principal.tenant, job.target.pool, "target.pool", item=index)
                pools[job.target.pool] = pool
            job = with_pool_defaults(job, pool)
        except ValidationError as exc:
            errors = [describe({**e, "loc": ("body", *e["loc"])}, JobCreate) for e in exc.errors()]
            fields = ", ".join(dict.fromkeys(f"`{e['field']}`" for e in errors))
            results[index] = {"index": index, "status": 422, "problem": problem_body(422, f"invalid: {fields}", errors)}
            continue
        except ProblemError as exc:
            results[index] = {
                "index": index,
                "status": exc.status,
                "problem": problem_body(exc.status, exc.detail, exc.errors, exc.slug),
            }
            continue
        assert resolved.next_nominal is not None
        job_id = ids.new_id()
        values = definition(job, resolved, settings.default_timeout_sec, cipher)
        values.update(
            {
                "id": job_id,
                "tenant_id": principal.tenant,
                "state": JobState.ACTIVE.value,
                "shard": ids.shard_for(job_id, settings.shards),
                "next_nominal_at": resolved.next_nominal,
                "next_fire_at": fire_at(job_id, resolved.next_nominal, job.jitter_sec),
                "traceparent": traceparent,
            }
        )
        accepted.append((index, values))
        payloads[index] = job.payload  # answered as sent: no need to decrypt what was just sealed
        targets[index] = (job.target.pool, job.target.handler)

    # Quotas, per item in order: the items past the create rate get 429, those past maxActiveJobs 403.
    granted, retry_after_ms = await take_creates(state, tenant, len(accepted)) if accepted else (0, 0)
    for index, _ in accepted[granted:]:
        assert tenant is not None and tenant.quotas.max_creates_per_sec is not None
        limited = rate_limited(tenant.quotas.max_creates_per_sec, retry_after_ms)
        results[index] = {"index": index, "status": 429, "problem": problem_body(429, limited.detail, limited.errors)}
    accepted = accepted[:granted]
    max_active_jobs = tenant.quotas.max_active_jobs if tenant is not None else None
    # The warnings a single create gives (a handler no live worker serves), read once per pool and handler.
    warned: dict[tuple[str, str], list[dict[str, str]]] = {}
    for index, _ in accepted:
        if targets[index] not in warned:
            warned[targets[index]] = await job_warnings(state, *targets[index])

    def answer(rows: list[Record]) -> dict[str, Any]:
        for (index, _), row in zip(accepted, rows, strict=False):
            view = render_job(row, cipher, payloads[index])
            if warnings := warned[targets[index]]:
                view["warnings"] = warnings
            results[index] = {"index": index, "status": 201, "job": view}
        for index, _ in accepted[len(rows) :]:  # past maxActiveJobs: nothing written for these
            assert max_active_jobs is not None
            over = QuotaExceededError("maxActiveJobs", max_active_jobs, max_active_jobs)
            results[index] = {
                "index": index,
                "status": 403,
                "problem": problem_body(403, over.detail, over.errors, over.slug),
            }
        return {"created": len(rows), "failed": len(body.jobs) - len(rows), "results": results}

    jobs = [values for _, values in accepted]
    if idempotency_key is None:
        rows = await state.stores.jobs.insert_jobs(jobs, actor=principal.subject, max_active_jobs=max_active_jobs)
    else:
        created = await idempotency.create_jobs_once(
            state, principal, idempotency_key, body, jobs, answer, cipher, max_active_jobs=max_active_jobs
        )
        if isinstance(created, Response):
            return created  # the first request's answer, replayed
        rows = created
    count_created((row["tenant_id"], row["type"]) for row in rows)
    horizon = state.clock.now() + timedelta(seconds=state.settings.hot_window_sec) + HOT_WINDOW_MARGIN
    await add_near_due(state.hot_window, rows, horizon)
    return OrjsonResponse(answer(rows))


def _schedule_key(job: JobCreate) -> tuple[Any, ...] | None:
    """What ``resolve`` reads of ``job`` (besides the batch's one ``now``): items with equal keys resolve alike.

    Instants count with their zone and fold, so only identical inputs share a result; RUN_LIST jobs (a list of
    instants each) are resolved on their own.
    """
    if job.run_list is not None:
        return None
    return (
        job.type,
        job.timezone,
        job.delay_seconds,
        job.schedule,
        job.interval_sec,
        job.max_runs,
        job.jitter_sec,
        *((at, at.tzinfo, at.fold) if at is not None else None for at in (job.run_at, job.start_at, job.end_at)),
    )
