"""Notification subscriptions (`/v1/notifications/subscriptions`), their delivery log and test sends."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from sundial_client.models.common import ViewModel


class SubscriptionView(ViewModel):
    id: str
    events: list[str]
    url: str | None = Field(None, description="The webhook's URL (none: an e-mail subscription).")
    email: str | None = Field(None, description="The address an e-mail subscription writes to.")
    email_confirmed: bool | None = Field(
        None,
        description="Whether the e-mail address was confirmed by the link sent to it; until it is, the "
        "subscription delivers nothing (each delivery FAILED, saying so).",
    )
    pool: str | None = None
    job_id: str | None = None
    description: str | None = None
    secret: str = Field(
        description="The signing secret: in full only in the answer to the create (store it then); redacted after."
    )
    created_at: datetime


class SubscriptionList(ViewModel):
    items: list[SubscriptionView]


class DeliveryView(ViewModel):
    id: str = Field(description="The delivery's id; `msg_<id>` is the `webhook-id` of each of its attempts.")
    incident_id: str
    event: str
    job_id: str | None = None
    execution_id: str | None = None
    state: str = Field(description="PENDING, DELIVERED, FAILED (attempts spent or refused) or CANCELLED.")
    attempts: int
    last_status: int | None = Field(
        None, description="The receiver's last HTTP status, or the SMTP relay's reply code (none: no answer)."
    )
    last_error: str | None = None
    occurred_at: datetime
    created_at: datetime
    finished_at: datetime | None = None
    next_attempt_at: datetime | None = Field(None, description="When a PENDING delivery is tried next.")


class DeliveryList(ViewModel):
    items: list[DeliveryView]


class TestSendView(ViewModel):
    delivery_id: str
    delivered: bool
    status: int | None = Field(None, description="The receiver's HTTP status (none: no answer, or refused).")
    error: str | None = None


class AllowedDestination(ViewModel):
    """A destination one tenant's subscriptions may reach although it is not public (an admin's allowance)."""

    tenant: str
    origin: str = Field(description="The destination allowed: `scheme://host:port`.")
    addresses: list[str] = Field(description="The addresses its host resolved to when it was allowed: only these.")
    allowed_by: str
    created_at: datetime


class AllowedDestinationList(ViewModel):
    items: list[AllowedDestination]
