"""Replays: the request (``POST /v1/replays``), the replay view with its partitions, and the staging runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import Field, field_validator
from sundial_client.models.replays import (
    Replay,
    ReplayFilterView,
    ReplayList,
    ReplayPartition,
    ReplayRun,
    ReplayRunList,
    ReplayState,
)

from sundial_api.models.common import Instant, RequestModel


class ReplayFilter(RequestModel):
    """Which messages of the window are replayed; every field given must match."""

    handler: str | None = Field(None, min_length=1, max_length=200, description="Only this handler's messages.")
    job_id: UUID | None = Field(None, description="Only this job's executions.")
    tenant_id: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="Only this tenant's messages. A tenant's token may only name its own tenant (and it is "
        "applied when omitted); an admin token may omit it to replay the whole pool.",
    )


class NewReplay(RequestModel):
    source_pool: str = Field(description="The pool whose topic is replayed.")
    window_from: Instant = Field(alias="from", description="Start of the window (inclusive), RFC 3339 with offset.")
    window_to: Instant = Field(alias="to", description="End of the window (exclusive); not in the future.")
    target_pool: str = Field(
        description="A registered pool of kind `staging` the caller's tenant may use; never the source."
    )
    filter: ReplayFilter = Field(default_factory=lambda: ReplayFilter())
    rate_per_sec: int | None = Field(None, ge=1, le=1_000_000, description="Most messages re-published a second.")
    dry_run: bool = Field(False, description="Scan and count what would be replayed, publish nothing.")

    @field_validator("window_from", "window_to")
    @classmethod
    def _with_offset(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("must carry a UTC offset (e.g. 2026-05-05T10:00:00Z): broker timestamps are UTC")
        return value


def render_partition(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "partition": row["partition"],
        "startOffset": row["start_offset"],
        "endOffset": row["end_offset"],
        "nextOffset": row["next_offset"],
        "scanned": row["scanned"],
        "matched": row["matched"],
        "published": row["published"],
    }


def render_replay(row: Mapping[str, Any], partitions: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A ``replays`` row (with ``duplicates`` where read) and its partitions as the Replay view."""
    return {
        "replayId": str(row["id"]),
        "state": row["state"],
        "sourcePool": row["source_pool"],
        "targetPool": row["target_pool"],
        "from": row["window_from"],
        "to": row["window_to"],
        "filter": {
            "handler": row["filter_handler"],
            "jobId": str(row["filter_job_id"]) if row["filter_job_id"] else None,
            "tenantId": row["filter_tenant_id"],
        },
        "ratePerSec": row["rate_per_sec"],
        "dryRun": row["dry_run"],
        "scanned": row["scanned"],
        "matched": row["matched"],
        "published": row["published"],
        "duplicates": row.get("duplicates"),
        "resumes": row["resumes"],
        "partitions": [render_partition(p) for p in partitions],
        "createdBy": row["created_by"],
        "cancelRequestedAt": row["cancel_requested_at"],
        "createdAt": row["created_at"],
        "startedAt": row["started_at"],
        "finishedAt": row["finished_at"],
        "error": row["error"],
    }


def render_run(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "originalExecutionId": str(row["original_execution_id"]),
        "sourcePartition": row["source_partition"],
        "sourceOffset": row["source_offset"],
        "handler": row["handler"],
        "outcome": row["outcome"],
        "error": row["error"],
        "durationMs": row["duration_ms"],
        "workerId": row["worker_id"],
        "deliveries": row["deliveries"],
        "recordedAt": row["recorded_at"],
    }
