"""Backfills: the request (``POST /v1/jobs/{id}:backfill``), the dry-run answer and the backfill view."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, StrictBool
from sundial_client.models.backfills import (
    DRY_RUN_LISTED,
    Backfill,
    BackfillList,
    BackfillOverlap,
    BackfillState,
    DryRun,
)

from sundial_api.models.common import Instant, RequestModel

#: Most occurrences one backfill may run.
MAX_BACKFILL = 10_000
MAX_RATE_PER_SEC = 1000.0


class NewBackfill(RequestModel):
    """A past range of a recurring job to run: its occurrences in `[from, to)` that have no execution yet."""

    range_from: Instant = Field(
        alias="from",
        description="Start of the range (inclusive), RFC 3339 with offset. Not before the job's `startAt`, nor "
        "older than the executions Postgres keeps (`SUNDIAL_EXECUTION_RETENTION_DAYS`): only while an "
        "occurrence's execution is kept can a second one be refused.",
    )
    range_to: Instant = Field(alias="to", description="End of the range (exclusive); not in the future.")
    overlap_policy: BackfillOverlap = Field(
        BackfillOverlap.ALLOW,
        description="`ALLOW`: start them at `ratePerSec` whatever is still running; `BUFFER_ONE`: one at a time, "
        "the next once the previous one has ended.",
    )
    rate_per_sec: float = Field(
        10.0,
        gt=0,
        le=MAX_RATE_PER_SEC,
        description="`ALLOW`: occurrences handled per second (at most 1000); one that already has an execution "
        "counts too, so at most this many executions are created per second.",
    )
    dry_run: StrictBool = Field(
        False, description="Only count: answer how many would run and the first nominal times; create nothing."
    )


def render_backfill(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "backfillId": str(row["id"]),
        "jobId": str(row["job_id"]),
        "from": row["range_from"],
        "to": row["range_to"],
        "overlapPolicy": row["overlap_policy"],
        "ratePerSec": row["rate_per_sec"],
        "state": row["state"],
        "total": row["total"],
        "created": row["created"],
        "finished": row["finished"],
        "cursor": row["cursor_at"],
        "createdAt": row["created_at"],
        "finishedAt": row["finished_at"],
    }
