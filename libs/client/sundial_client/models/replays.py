"""Replays: a window of a pool's messages replayed into a staging pool (`/v1/replays`) and its runs."""

from __future__ import annotations

import enum
from datetime import datetime

from pydantic import Field

from sundial_client.models.common import ViewModel


class ReplayState(enum.StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


FINAL_STATES = frozenset({ReplayState.SUCCEEDED, ReplayState.FAILED, ReplayState.CANCELLED})


class ReplayPartition(ViewModel):
    partition: int
    start_offset: int
    end_offset: int | None = Field(description="Null until found by reading (a broker without a time index).")
    next_offset: int = Field(description="The first offset not re-published yet.")
    scanned: int
    matched: int
    published: int


class ReplayFilterView(ViewModel):
    handler: str | None
    job_id: str | None
    tenant_id: str | None


class Replay(ViewModel):
    replay_id: str
    state: ReplayState
    source_pool: str
    target_pool: str
    window_from: datetime = Field(alias="from")
    window_to: datetime = Field(alias="to")
    filter: ReplayFilterView
    rate_per_sec: int | None
    dry_run: bool
    scanned: int = Field(description="Messages of the source topic read.")
    matched: int = Field(description="Of those, in the window and selected by the filter.")
    published: int = Field(description="Re-published into the target pool's topic (0 for a dry run).")
    duplicates: int | None = Field(
        None, description="Deliveries to staging beyond the first (a resumed replay re-publishes its last batch)."
    )
    resumes: int = Field(description="How often a replayer took it over mid-way.")
    partitions: list[ReplayPartition]
    created_by: str
    cancel_requested_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None

    @property
    def ended(self) -> bool:
        return self.state in FINAL_STATES


class ReplayList(ViewModel):
    items: list[Replay]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")


class ReplayRun(ViewModel):
    original_execution_id: str
    source_partition: int
    source_offset: int
    handler: str
    outcome: str = Field(description="SUCCEEDED, FAILED or TIMED_OUT.")
    error: str | None
    duration_ms: float
    worker_id: str
    deliveries: int = Field(description="How many times staging received it (1 unless replayed again).")
    recorded_at: datetime


class ReplayRunList(ViewModel):
    items: list[ReplayRun]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")
