"""Notification subscriptions as tenants write them (`POST /v1/notifications/subscriptions`) and read them."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from pydantic import Field, StrictStr
from sundial_client.models.notifications import DeliveryView, SubscriptionView
from sundial_common.stores.notifications import EVENTS
from sundial_common.stores.types import Record

from sundial_api.models.common import RequestModel

MAX_EVENTS = len(EVENTS)


class SubscriptionCreate(RequestModel):
    """A webhook to tell about events of the tenant's jobs: all of them, one pool's (`pool`) or one job's (`jobId`)."""

    url: StrictStr | None = Field(
        None,
        max_length=2000,
        description="Where to POST: an `https://` URL (plain `http://` only on a development stack) whose host "
        "resolves to public addresses, unless an administrator allowed the network "
        "(SUNDIAL_DELIVERY_ALLOWED_NETWORKS). Give `url` or `email`.",
        examples=["https://hooks.example.com/sundial"],
    )
    email: StrictStr | None = Field(
        None,
        max_length=254,
        description="Or an e-mail address to write to, through the deployment's SMTP relay: a confirmation link "
        "is sent to it first, and nothing else is until someone follows it.",
        examples=["oncall@example.com"],
    )
    events: list[StrictStr] = Field(
        min_length=1,
        max_length=MAX_EVENTS,
        description="The events to be told about: " + "; ".join(f"`{k}`: {v}" for k, v in EVENTS.items()) + ".",
        examples=[["execution.dead"]],
    )
    pool: StrictStr | None = Field(
        None, pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$", description="Only events of jobs in this pool."
    )
    job_id: UUID | None = Field(None, description="Only events of this job.")
    description: StrictStr | None = Field(None, max_length=200, description="A note for people reading the list.")


def render_subscription(row: Record, secret: str) -> dict[str, Any]:
    """A subscription as the API shows it: ``secret`` in full only when it was just made, else redacted."""
    view = SubscriptionView(
        id=str(row["id"]),
        events=list(row["events"]),
        url=None if row["url"].startswith("mailto:") else row["url"],
        email=row["url"].removeprefix("mailto:") if row["url"].startswith("mailto:") else None,
        email_confirmed=(row["email_confirmed_at"] is not None) if row["url"].startswith("mailto:") else None,
        pool=row["pool"],
        job_id=str(row["job_id"]) if row["job_id"] else None,
        description=row["description"],
        secret=secret,
        created_at=row["created_at"],
    )
    return view.model_dump(mode="json", by_alias=True)


def render_delivery(row: Record) -> dict[str, Any]:
    view = DeliveryView(
        id=str(row["id"]),
        incident_id=str(row["incident_id"]),
        event=row["event"],
        job_id=str(row["job_id"]) if row["job_id"] else None,
        execution_id=str(row["execution_id"]) if row["execution_id"] else None,
        state=row["state"],
        attempts=row["attempts"],
        last_status=row["last_status"],
        last_error=row["last_error"],
        occurred_at=row["occurred_at"],
        created_at=row["created_at"],
        finished_at=row["finished_at"],
        next_attempt_at=row["next_attempt_at"] if row["state"] == "PENDING" else None,
    )
    return view.model_dump(mode="json", by_alias=True)
