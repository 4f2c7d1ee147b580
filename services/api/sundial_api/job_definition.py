"""A job body and the ``jobs`` row it defines: how a create (single or batched) or a change is validated — its
payload, its schedule, its parents — which columns it writes, and a stored row read back as the body that would
create it (what a ``PATCH`` is merged into).

Every check here answers a 422 (or 413, for the payload's size) naming the field, before anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import orjson
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from sundial_common.domain.schedules import Kind, ScheduleSpec
from sundial_common.security.encryption import PAYLOAD, TenantCipher
from sundial_common.stores.dependencies import Edge, GraphError
from sundial_common.stores.tenants import Tenant
from sundial_common.stores.types import Record

from sundial_api.json_body import NUL_ESCAPE
from sundial_api.models.jobs import JobCreate
from sundial_api.models.schedules import TYPE_FIELDS, JobType, SchedulePreviewRequest
from sundial_api.problems import ProblemError, field_error, invalid
from sundial_api.schedule import Resolved, ScheduleError, resolve_schedule
from sundial_api.state import ApiState


def with_tenant_defaults(body: JobCreate, tenant: Tenant | None) -> JobCreate:
    """``body`` with the tenant's defaults filled in: its default jitter for a CRON job that sets none."""
    if tenant is None or not tenant.default_jitter_sec or body.type is not JobType.CRON:
        return body
    if "jitter_sec" in body.model_fields_set:  # `jitterSec: 0` opts out
        return body
    return body.model_copy(update={"jitter_sec": tenant.default_jitter_sec})


def edges_of(body: JobCreate) -> list[Edge]:
    """A DEPENDENT job's parents (422 when it names none); none for the other types."""
    if body.type is not JobType.DEPENDENT:
        return []
    if not body.depends_on:
        raise invalid("dependsOn", "is required for DEPENDENT jobs: name at least one parent job")
    return [Edge(d.job_id, d.on.value) for d in body.depends_on]


def graph_problem(exc: GraphError) -> ProblemError:
    if exc.status == 404:
        return ProblemError(404, f"`{exc.field}`: {exc.message}", errors=[field_error(exc.field, exc.message)])
    return invalid(exc.field, exc.message)


def check_payload(payload: Any, max_bytes: int) -> None:
    # Valid JSON that Postgres' jsonb cannot hold must be a 422 here, not a 500 at the INSERT.
    try:
        payload_json = orjson.dumps(payload)
    except orjson.JSONEncodeError as exc:  # integers beyond 64 bits, nesting deeper than 255
        raise invalid("payload", f"cannot be stored: {exc}") from None
    if b"\\u0000" in payload_json and NUL_ESCAPE.search(payload_json):
        raise invalid("payload", "cannot contain the NUL character (\\u0000)")
    payload_size = len(payload_json)
    if payload_size > max_bytes:
        message = f"is {payload_size} bytes as JSON; at most {max_bytes} are accepted"
        raise ProblemError(413, f"`payload` {message}", errors=[field_error("payload", message)])


def resolve(body: JobCreate | SchedulePreviewRequest, state: ApiState, now: datetime, runs: int = 0) -> Resolved:
    """The request's schedule and its next occurrence; 422 naming the field when it cannot fire."""
    if body.type is JobType.DEPENDENT:  # no clock: it fires after its parents
        return Resolved(ScheduleSpec(kind=Kind.DEPENDENT, timezone=body.timezone), None)
    try:
        return resolve_schedule(
            body.type,
            zone=body.timezone,
            now=now,
            grace_sec=state.settings.run_at_grace_sec,
            min_interval_sec=state.settings.min_interval_sec,
            run_at=body.run_at,
            delay_seconds=body.delay_seconds,
            cron=body.schedule,
            interval_sec=body.interval_sec,
            run_list=body.run_list,
            start_at=body.start_at,
            end_at=body.end_at,
            max_runs=body.max_runs,
            jitter_sec=body.jitter_sec if isinstance(body, JobCreate) else 0,
            runs=runs,
        )
    except ScheduleError as exc:
        raise invalid(exc.field, exc.message) from None


def definition(body: JobCreate, resolved: Resolved, default_timeout_sec: int, cipher: TenantCipher) -> dict[str, Any]:
    """The ``jobs`` columns that define a job (what ``insert_job`` and ``update_job`` write)."""
    spec = resolved.spec
    return {
        "name": body.name,
        "type": body.type.value,
        "schedule": spec.cron,
        "timezone": body.timezone,
        # ONE_SHOT keeps the instant it was asked for; DELAYED's instant is its first occurrence.
        "run_at": spec.run_at if body.type is JobType.ONE_SHOT else None,
        "delay_seconds": body.delay_seconds,
        "interval_sec": spec.interval_sec,
        "run_list": list(spec.run_list) or None,
        "start_at": spec.start_at,
        "end_at": spec.end_at,
        "max_runs": spec.max_runs,
        "jitter_sec": body.jitter_sec,
        "overlap_policy": body.overlap_policy.value,
        "catchup_policy": body.catchup_policy.value,
        "catchup_window_sec": body.catchup_window_sec,
        "pool": body.target.pool,
        "handler": body.target.handler,
        # Sealed here, once: the dispatcher copies it into Kafka as it is, only the worker opens it.
        "payload": cipher.seal_json(body.payload, PAYLOAD),
        # camelCase, as the client wrote it and as the dispatcher reads it (``maxAttempts``).
        "retry_policy": body.retry_policy.model_dump(mode="json", by_alias=True),
        "timeout_sec": body.timeout_sec if body.timeout_sec is not None else default_timeout_sec,
        "priority": body.priority.value,
        "labels": body.labels,
        "breaker": body.breaker.model_dump(mode="json", by_alias=True, exclude_none=True)
        if body.breaker is not None
        else None,
    }


def as_body(row: Record, cipher: TenantCipher) -> dict[str, Any]:
    """A stored job as the request body that would create it (camelCase, instants as RFC 3339)."""

    def iso(value: datetime | None) -> str | None:
        return None if value is None else value.isoformat()

    body: dict[str, Any] = {
        "name": row["name"],
        "type": row["type"],
        "timezone": row["timezone"],
        "runAt": iso(row["run_at"]),
        "delaySeconds": row["delay_seconds"],
        "schedule": row["schedule"],
        "intervalSec": row["interval_sec"],
        "runList": [iso(i) for i in row["run_list"]] if row["run_list"] else None,
        "startAt": iso(row["start_at"]),
        "endAt": iso(row["end_at"]),
        "maxRuns": row["max_runs"],
        "jitterSec": row["jitter_sec"],
        "overlapPolicy": row["overlap_policy"],
        "catchupPolicy": row["catchup_policy"],
        "catchupWindowSec": row["catchup_window_sec"],
        "target": {"pool": row["pool"], "handler": row["handler"]},
        "payload": cipher.open_json(row["payload"], PAYLOAD),
        "retryPolicy": row["retry_policy"],
        "timeoutSec": row["timeout_sec"],
        "priority": row["priority"],
        "labels": row["labels"],
        "breaker": row["breaker"],
    }
    if row["type"] == JobType.DEPENDENT:
        body.pop("overlapPolicy")  # its catch-up policy applies to late triggers; overlap is not its
    elif row["type"] not in (JobType.CRON, JobType.INTERVAL, JobType.RUN_LIST):
        for name in ("overlapPolicy", "catchupPolicy", "catchupWindowSec"):
            body.pop(name)  # defaults a one-off cannot be given explicitly
    return body


def merged(row: Record, patch: Mapping[str, Any], cipher: TenantCipher) -> JobCreate:
    """The job as changed, validated like a new one (a 422 names the field, as for a create)."""
    body = as_body(row, cipher)
    new_type = patch.get("type")
    if new_type is not None and new_type != row["type"]:
        for name in TYPE_FIELDS.values():  # the old type's own field goes with it
            body[name] = None
        if new_type not in (JobType.CRON, JobType.INTERVAL, JobType.RUN_LIST):
            for name in ("startAt", "endAt", "maxRuns", "overlapPolicy", "catchupPolicy", "catchupWindowSec"):
                body[name] = None
    body.update(patch)
    try:
        return JobCreate.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
