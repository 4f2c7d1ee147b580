"""Job keys: a tenant's own unique name for a job, so that a deployment can register "its" job again safely and
address it without keeping the UUID.

A create (``POST /v1/jobs``) may give a ``key``. The job stores it with the SHA-256 of the body that registered it
(``key_digest``). A later create naming the same key answers, without writing anything:

- the job registered with it, **200**, when its body is the same (a retried or repeated deployment; like an
  ``Idempotency-Key``, but for as long as the job exists, and whatever the job became since through ``PATCH``);
- **409** naming ``key`` and the job's id when the body differs: one key never silently means two definitions.

Two creates racing with one key are settled by the unique index: the loser reads the winner's job and answers as
above. A batch (``POST /v1/jobs:batch``) refuses keyed items (422 naming ``key``): its one statement would fail
whole on a clash. ``GET /v1/jobs:by-key/{key}`` reads the job as ``GET /v1/jobs/{id}`` does, and ``GET /v1/jobs``
filters by ``key``.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Path
from starlette.responses import Response
from sundial_common.security.auth import Principal
from sundial_common.security.encryption import TenantCipher
from sundial_common.stores.types import Record

from sundial_api.auth import Authenticated
from sundial_api.job_detail import etag, job_detail
from sundial_api.models.jobs import JobCreate, JobDetail, render_job
from sundial_api.problems import ProblemError, field_error, not_found, responses
from sundial_api.responses import OrjsonResponse
from sundial_api.state import ApiState, State

router = APIRouter(prefix="/v1", tags=["jobs"])


def digest(body: JobCreate) -> str:
    """The body's fingerprint: equal for equal definitions (defaults written out or left out alike)."""
    canonical = orjson.dumps(body.model_dump(mode="json", by_alias=True), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


def key_columns(body: JobCreate) -> dict[str, Any]:
    """The ``jobs`` columns a create writes for the body's key (none without one)."""
    return {} if body.key is None else {"key": body.key, "key_digest": digest(body)}


async def registered(state: ApiState, principal: Principal, body: JobCreate, cipher: TenantCipher) -> Response | None:
    """The answer to a create whose key is already registered (200 or 409); None when it is free (or absent)."""
    if body.key is None:
        return None
    row = await state.stores.jobs.get_job_by_key(principal.tenant, body.key)
    return None if row is None else answer(row, body, cipher)


async def lost_race(state: ApiState, principal: Principal, body: JobCreate, cipher: TenantCipher) -> Response:
    """The answer to a create whose insert found its key taken meanwhile by a concurrent create."""
    answered = await registered(state, principal, body, cipher)
    if answered is None:  # registered, then gone again (cancelled and pruned) in between: rare; the client retries
        raise ProblemError(409, f"job key `{body.key}` changed hands during this create; retry", slug="job-key-taken")
    return answered


def answer(row: Record, body: JobCreate, cipher: TenantCipher) -> Response:
    """The registered job (200) when ``body`` is what registered it; else 409 naming the key and the job."""
    job_id = str(row["id"])
    if row["key_digest"] == digest(body):
        return OrjsonResponse(render_job(row, cipher), headers={"Location": f"/v1/jobs/{job_id}", **etag(row)})
    message = f"is already the key of job {job_id}, registered with another definition"
    raise ProblemError(
        409,
        f"job key `{body.key}` is taken by job {job_id} ({row['state']}), registered with another definition: "
        f"change that job with PATCH /v1/jobs/{job_id}, or choose another key",
        errors=[field_error("key", message)],
        slug="job-key-taken",
        headers={"Location": f"/v1/jobs/{job_id}"},
    )


JobKey = Annotated[str, Path(description="The key the job was registered with (`key` in its body).")]


@router.get(
    "/jobs:by-key/{key:path}",
    response_model=JobDetail,
    responses=responses(401, 404, 503),
    summary="Read a job by its key",
)
async def get_job_by_key(key: JobKey, state: State, principal: Authenticated) -> Response:
    """As `GET /v1/jobs/{id}`, for the job registered with `key`; 404 when the tenant has no job with that key."""
    row = await state.stores.jobs.get_job_by_key(principal.tenant, key)
    if row is None:
        raise not_found("job with key", key)
    return await job_detail(state, principal, row["id"], key)
