"""The audit trail of a job, an execution or a breaker (`GET /v1/jobs/{id}/audit`, …)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from sundial_client.models.common import ViewModel


class AuditEntry(ViewModel):
    """One change: what happened, the state before and after, who did it and when."""

    at: datetime = Field(description="When the change committed (Postgres' clock).")
    action: str = Field(
        description="Jobs: `create`, `update`, `pause`, `resume`, `trigger`, `cancel` (DELETE), `complete`, `missed`. "
        "Executions: `dispatch`, `skip`, `start`, `finish`, `retry`, `retry_request`, `sweep`, `dead`, `cancel`, "
        "`cancel_request`, or an event a worker recorded (e.g. `refused`). Breakers: `opened`, `half_opened`, "
        "`probes_renewed`, `reopened`, `closed`, `opened_by_operator`, `closed_by_operator`."
    )
    from_state: str | None = Field(description="The state before the change (null: created, or unchanged).")
    to_state: str | None = Field(description="The state after it (null: the state did not change).")
    actor: str = Field(
        description="Who made the change: the bearer token's subject (`sub`) for API calls, the process (worker, "
        "dispatcher, sweeper instance) for the rest."
    )
    detail: dict[str, Any] | None = Field(
        description="What else the change recorded: for `update`, the fields `changed` and their values `before` "
        "and `after` (a payload's value is never copied here); for `trigger`, its `executionId`; for attempts, "
        "`attempt`, `nextAttemptAt`, `worker`."
    )


class AuditPage(ViewModel):
    items: list[AuditEntry] = Field(description="Oldest first.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")
