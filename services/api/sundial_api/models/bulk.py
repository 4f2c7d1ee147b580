"""Bulk operations: the request (``POST /v1/bulk-operations``), the dry-run answer, the operation and its items."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from pydantic import Field, StrictBool, field_validator
from sundial_client.models.bulk import (
    BulkDryRun,
    BulkFilterView,
    BulkItem,
    BulkItemList,
    BulkOperation,
    BulkOperationList,
    BulkState,
)
from sundial_common.domain.operations import Progress

from sundial_api.models.common import Instant, RequestModel

__all__ = [
    "BulkDryRun",
    "BulkFilter",
    "BulkFilterView",
    "BulkItem",
    "BulkItemList",
    "BulkOperation",
    "BulkOperationList",
    "BulkState",
    "BulkTarget",
    "NewBulkOperation",
    "render_item",
    "render_operation",
]

#: The per-operation rate when the request names none.
DEFAULT_RATE_PER_SEC = 500


class BulkTarget(enum.StrEnum):
    EXECUTIONS = "executions"
    JOBS = "jobs"


class BulkFilter(RequestModel):
    """Which rows of the tenant the action applies to; every field given must match, and at least one must be given
    (an empty filter would select everything). Only rows the action can act on are ever selected (a re-drive
    selects DEAD executions, and FAILED ones a breaker holds; a pause, ACTIVE jobs; …)."""

    state: list[str] | None = Field(
        None, min_length=1, max_length=10, description="Any of these states (a single string is accepted too)."
    )
    pool: str | None = Field(None, min_length=1, max_length=63)
    handler: str | None = Field(None, min_length=1, max_length=200)
    labels: dict[str, str] | None = Field(
        None, max_length=20, description="Labels the job carries (all of them), for executions their job's."
    )
    name_prefix: str | None = Field(None, min_length=1, max_length=200, description="The job's name starts so.")
    priority: str | None = Field(None, pattern="^(HIGH|NORMAL|LOW)$")
    scheduled_from: Instant | None = Field(
        None, description="Scheduled at or after (an execution's `scheduledFor`; a job's next fire)."
    )
    scheduled_to: Instant | None = Field(None, description="Scheduled before.")
    finished_from: Instant | None = Field(None, description="Finished at or after (executions only).")
    finished_to: Instant | None = Field(None, description="Finished before (executions only).")
    job_ids: list[UUID] | None = Field(None, min_length=1, description="Only these jobs (executions: of these jobs).")

    @field_validator("state", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("scheduled_from", "scheduled_to", "finished_from", "finished_to")
    @classmethod
    def _with_offset(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("must carry a UTC offset (e.g. 2026-05-05T10:00:00Z)")
        return value


class NewBulkOperation(RequestModel):
    target: BulkTarget = Field(description="What the action applies to: `executions` or `jobs`.")
    action: str = Field(
        description="For executions: `redrive` (a DEAD one, or a FAILED one a breaker holds, gets a new attempt "
        "now, through the retry breaker like any retry) or `cancel`. For jobs: `pause`, `resume`, `cancel` (as "
        "`DELETE /v1/jobs/{id}`) or `trigger` (one run now)."
    )
    filter: BulkFilter
    rate_per_sec: int = Field(
        DEFAULT_RATE_PER_SEC,
        ge=1,
        le=100_000,
        description="Most rows acted on a second (the runner caps it per tenant).",
    )
    dry_run: StrictBool = Field(False, description="Answer the exact count and the first 20 rows; change nothing.")
    tenant_id: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="Whose rows (an admin token only, which must name one tenant; a tenant's token acts on its own).",
    )


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def render_operation(row: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """A ``bulk_operations`` row as the BulkOperation view."""
    stored = row["filter"]
    progress = Progress(
        row["total"], row["done"] + row["skipped"] + row["failed"], row["started_at"], row["finished_at"]
    )
    return {
        "operationId": str(row["id"]),
        "tenantId": row["tenant_id"],
        "target": row["target"],
        "action": row["action"],
        "filter": {("state" if k == "states" else _camel(k)): v for k, v in stored.items()},
        "state": row["state"],
        "ratePerSec": row["rate_per_sec"],
        "total": row["total"],
        "done": row["done"],
        "skipped": row["skipped"],
        "failed": row["failed"],
        "eta": _iso(progress.eta(now)),
        "resumes": row["resumes"],
        "createdBy": row["created_by"],
        "cancelRequestedAt": row["cancel_requested_at"],
        "createdAt": row["created_at"],
        "startedAt": row["started_at"],
        "finishedAt": row["finished_at"],
        "error": row["error"],
    }


def render_item(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "seq": row["seq"],
        "id": str(row["target_id"]),
        "outcome": row["outcome"],
        "reason": row["reason"],
        "actedAt": row["acted_at"],
    }


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)
