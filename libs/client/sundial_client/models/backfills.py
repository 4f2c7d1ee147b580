"""Backfills: a recurring job's past range run (`POST /v1/jobs/{id}:backfill`, `GET /v1/backfills/{id}`)."""

from __future__ import annotations

import enum
from datetime import datetime

from pydantic import Field

from sundial_client.models.common import ViewModel

#: How many nominal times a dry run lists.
DRY_RUN_LISTED = 20


class BackfillOverlap(enum.StrEnum):
    ALLOW = "ALLOW"
    BUFFER_ONE = "BUFFER_ONE"


class BackfillState(enum.StrEnum):
    RUNNING = "RUNNING"
    DONE = "DONE"
    CANCELLED = "CANCELLED"


class DryRun(ViewModel):
    count: int = Field(description="Occurrences of the range without an execution: what the backfill would run.")
    first: list[datetime] = Field(description=f"The first {DRY_RUN_LISTED} of them, nominal times in UTC.")


class Backfill(ViewModel):
    backfill_id: str
    job_id: str
    range_from: datetime = Field(alias="from")
    range_to: datetime = Field(alias="to")
    overlap_policy: BackfillOverlap
    rate_per_sec: float
    state: BackfillState = Field(
        description="RUNNING (creating executions); DONE (every occurrence of the range has its execution); "
        "CANCELLED (no more are created; those created run on)."
    )
    total: int = Field(description="Occurrences of the range that had no execution when the backfill began.")
    created: int = Field(description="Executions the backfill has created so far.")
    finished: int = Field(description="Of those, the ones that reached a final state (SUCCEEDED, DEAD, CANCELLED).")
    cursor: datetime | None = Field(description="The last nominal time handled.")
    created_at: datetime
    finished_at: datetime | None


class BackfillList(ViewModel):
    items: list[Backfill] = Field(description="Newest first.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")
