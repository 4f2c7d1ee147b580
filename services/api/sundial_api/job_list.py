"""``GET /v1/jobs``: page through the tenant's jobs, newest first, with optional filters.

Filters: ``state``, ``type``, ``pool``, ``handler``, ``key`` (exact), ``namePrefix``, ``label=key:value`` (repeatable;
every one must match), ``createdFrom``/``createdTo`` and ``nextFireFrom``/``nextFireTo`` (half-open ranges).
Pages are keyset pages on the job id (a UUIDv7, so newest first is creation order) in the API's usual shape,
``items`` and ``nextCursor``: a page never repeats or skips a job however many are created while a client pages. The
response models live here, beside the route (``models.py`` is being split per resource; this module only
imports from it).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Query
from starlette.responses import Response
from sundial_common.stores.jobs import JobFilter

from sundial_api.auth import Authenticated
from sundial_api.models.jobs import MAX_LABELS, JobList, JobState, render_job
from sundial_api.models.schedules import JobType
from sundial_api.pagination import InvalidCursor, decode_id_cursor, encode_id_cursor
from sundial_api.problems import invalid, responses
from sundial_api.responses import OrjsonResponse
from sundial_api.state import State

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

_CURSOR_PREFIX = "j1"


def decode_cursor(cursor: str) -> UUID:
    try:
        return decode_id_cursor(_CURSOR_PREFIX, cursor)
    except InvalidCursor as exc:
        raise invalid("cursor", str(exc)) from None


def _labels(raw: list[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in raw:
        key, sep, value = item.partition(":")
        if not sep or not key:
            raise invalid("label", f"`{item}` is not `key:value`")
        labels[key] = value
    return labels


def _aware(name: str, value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        raise invalid(name, "needs an offset (RFC 3339, e.g. 2026-05-05T10:00:00Z)")
    return value


@router.get(
    "",
    response_model=JobList,
    responses=responses(401, 422, 503),
    summary="List jobs, newest first",
)
async def list_jobs_route(
    state: State,
    principal: Authenticated,
    job_state: Annotated[JobState | None, Query(alias="state", description="Only jobs in this state.")] = None,
    job_type: Annotated[JobType | None, Query(alias="type", description="Only jobs of this type.")] = None,
    pool: Annotated[str | None, Query(max_length=63, description="Only jobs delivered to this pool.")] = None,
    handler: Annotated[str | None, Query(max_length=128, description="Only jobs run by this handler.")] = None,
    name_prefix: Annotated[
        str | None, Query(alias="namePrefix", max_length=200, description="Only jobs whose name starts so.")
    ] = None,
    label: Annotated[
        list[str] | None,
        Query(description="`key:value`; repeat for several labels, each must be on the job.", max_length=MAX_LABELS),
    ] = None,
    created_from: Annotated[datetime | None, Query(alias="createdFrom", description="Created at or after.")] = None,
    created_to: Annotated[datetime | None, Query(alias="createdTo", description="Created before.")] = None,
    next_fire_from: Annotated[
        datetime | None, Query(alias="nextFireFrom", description="Next fire at or after.")
    ] = None,
    next_fire_to: Annotated[datetime | None, Query(alias="nextFireTo", description="Next fire before.")] = None,
    key: Annotated[
        str | None, Query(max_length=200, description="Only the job registered with this key (at most one).")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200, description="Page size.")] = 50,
    cursor: Annotated[
        str | None, Query(description="`nextCursor` of the previous page; omit for the first page.")
    ] = None,
) -> Response:
    before = decode_cursor(cursor) if cursor is not None else None
    where = JobFilter(
        state=job_state.value if job_state is not None else None,
        type=job_type.value if job_type is not None else None,
        pool=pool,
        handler=handler,
        name_prefix=name_prefix,
        labels=_labels(label) if label else None,
        created_from=_aware("createdFrom", created_from),
        created_to=_aware("createdTo", created_to),
        next_fire_from=_aware("nextFireFrom", next_fire_from),
        next_fire_to=_aware("nextFireTo", next_fire_to),
        key=key,
    )
    # One row more than the page tells whether another page exists without a count query.
    rows = await state.stores.jobs.list_jobs(principal.tenant, where, before, limit + 1)
    page = rows[:limit]
    next_cursor = encode_id_cursor(_CURSOR_PREFIX, page[-1]["id"]) if len(rows) > limit else None
    cipher = await state.keyring.cipher(principal.tenant)
    return OrjsonResponse({"items": [render_job(row, cipher) for row in page], "nextCursor": next_cursor})
