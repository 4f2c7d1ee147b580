"""Bulk operations: one action on every job or execution a filter selects (`/v1/bulk-operations`)."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from pydantic import Field

from sundial_client.models.common import ViewModel


class BulkState(enum.StrEnum):
    PREPARING = "PREPARING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


FINAL_STATES = frozenset({BulkState.SUCCEEDED, BulkState.FAILED, BulkState.CANCELLED})


class BulkFilterView(ViewModel):
    state: list[str] | None = None
    pool: str | None = None
    handler: str | None = None
    labels: dict[str, str] | None = None
    name_prefix: str | None = None
    priority: str | None = None
    scheduled_from: datetime | None = None
    scheduled_to: datetime | None = None
    finished_from: datetime | None = None
    finished_to: datetime | None = None
    job_ids: list[str] | None = None


class BulkOperation(ViewModel):
    operation_id: str
    tenant_id: str = Field(description="Whose rows it acts on (one tenant, always).")
    target: str = Field(description="`executions` or `jobs`.")
    action: str
    filter: BulkFilterView
    state: BulkState
    rate_per_sec: int = Field(description="Most rows acted on a second.")
    total: int | None = Field(description="Rows selected; null while PREPARING (the selection is being fixed).")
    done: int = Field(description="Rows acted on.")
    skipped: int = Field(description="Rows that no longer matched when their turn came (e.g. already re-driven).")
    failed: int = Field(description="Rows the action failed on (see the items for why).")
    eta: datetime | None = Field(description="When it should be done at the rate held so far.")
    resumes: int = Field(description="How often a runner took it over mid-way.")
    created_by: str
    cancel_requested_at: datetime | None
    created_at: datetime = Field(description="The selection's watermark: rows created later are never selected.")
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None

    @property
    def ended(self) -> bool:
        return self.state in FINAL_STATES


class BulkOperationList(ViewModel):
    items: list[BulkOperation]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")


class BulkDryRun(ViewModel):
    target: str
    action: str
    count: int = Field(description="Rows the filter selects now: what a run created now would act on.")
    sample: list[dict[str, Any]] = Field(description="The first 20 of them, by id.")


class BulkItem(ViewModel):
    seq: int = Field(description="Its place in the selection (the order rows are acted on).")
    id: str = Field(description="The job's or execution's id.")
    outcome: str | None = Field(description="DONE, SKIPPED or FAILED; null until its turn.")
    reason: str | None
    acted_at: datetime | None


class BulkItemList(ViewModel):
    items: list[BulkItem]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")
