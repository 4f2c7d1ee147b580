"""Sends the notifications the sweeper recorded: claims due deliveries, signs and posts them, records the answer.

The sweeper notices incidents but holds no tenant key, and a delivery needs the subscription's secret, which
is sealed under the tenant's data key. The API replicas hold the keys, so each runs this loop: a pass claims a
batch of due deliveries (a lease per row, so replicas share the work and a replica that dies mid-send leaves
its rows to the next claim; no claim goes beyond the caps per tenant and per destination, on attempts in flight
and in the last minute, whatever the number of replicas), sends each once through
:class:`~sundial_common.delivery.sender.Sender`, and finishes it with a compare-and-swap on its attempt number:
DELIVERED on 2xx, PENDING again after the backoff (or the receiver's ``Retry-After``) on a transient failure,
FAILED on a permanent one or the last attempt.

Every attempt of one delivery carries the delivery's id as ``webhook-id``: a receiver that got an attempt
whose answer was lost sees the retry as the same message.

An e-mail subscription (``url`` ``mailto:<address>``) is sent through the SMTP relay
(:mod:`sundial_common.delivery.mail`) with the same id as its ``Message-ID``, once its address is confirmed; until
then each of its deliveries is FAILED at once, saying so in the delivery log.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import orjson
from sundial_common.delivery.mail import MailRelay, send_mail
from sundial_common.delivery.sender import OutboundRequest, Outcome, Sender
from sundial_common.domain.retry_policy import RetryPolicy
from sundial_common.security.encryption import Keyring
from sundial_common.stores.notifications import DeliveryCaps, NotificationStore

log = logging.getLogger("sundial.api.notifications")

#: The kind of value a subscription's sealed secrets are (the associated data of their sealing).
SECRETS = "webhook_secrets"
#: An e-mail subscription's ``url`` starts so; the address follows.
MAILTO = "mailto:"
UNCONFIRMED = "e-mail address not confirmed: the confirmation link sent to it was not followed; nothing is sent"
NO_RELAY = "no SMTP relay configured (SUNDIAL_SMTP_HOST): e-mail cannot be sent"


DEFAULT_RETRY = RetryPolicy(max_attempts=8, backoff="EXPONENTIAL", initial_delay_ms=10_000, max_delay_ms=3_600_000)


@dataclass(frozen=True)
class NotificationDeliveryConfig:
    """``interval_sec``: between passes while there is work; ``idle_interval_sec``: the longest wait while idle;
    ``batch``: deliveries claimed per pass; ``concurrency``: requests in flight at once; ``lease_sec``: how long
    a claim lasts (longer than one request may take); ``retry``: attempts and backoff of one delivery; ``caps``:
    per tenant and per destination, over all replicas."""

    interval_sec: float = 1.0
    idle_interval_sec: float = 5.0
    batch: int = 50
    concurrency: int = 10
    lease_sec: float = 120.0
    retry: RetryPolicy = field(default_factory=lambda: DEFAULT_RETRY)
    caps: DeliveryCaps = field(default_factory=DeliveryCaps)

    def __post_init__(self) -> None:
        if not 0 < self.interval_sec <= self.idle_interval_sec:
            raise ValueError("interval_sec must be > 0 and at most idle_interval_sec")
        if self.batch < 1 or self.concurrency < 1:
            raise ValueError("batch and concurrency must be >= 1")
        if self.lease_sec <= 0:
            raise ValueError("lease_sec must be > 0")


@dataclass(frozen=True)
class DeliveryPass:
    delivered: int = 0
    retried: int = 0
    failed: int = 0


def notification_body(row: Mapping[str, Any]) -> bytes:
    """The JSON a receiver gets: Standard Webhooks' ``{type, timestamp, data}``."""
    occurred: datetime = row["occurred_at"]
    detail = row["detail"]
    if isinstance(detail, str):
        detail = orjson.loads(detail)
    data: dict[str, Any] = {
        "incidentId": str(row["incident_id"]),
        "tenant": row["tenant_id"],
        "pool": row["pool"],
        "jobId": str(row["job_id"]) if row["job_id"] else None,
        "executionId": str(row["execution_id"]) if row["execution_id"] else None,
        **(detail or {}),
    }
    return orjson.dumps({"type": row["event"], "timestamp": occurred.isoformat(), "data": data})


class NotificationDelivery:
    """One replica's share of the notification deliveries (:meth:`run_once` is one pass)."""

    def __init__(
        self,
        config: NotificationDeliveryConfig,
        store: NotificationStore,
        keyring: Keyring,
        sender: Sender,
        mail: MailRelay | None = None,
    ) -> None:
        self.config = config
        self._store = store
        self._keyring = keyring
        self.sender = sender
        self.mail = mail
        self._slots = asyncio.Semaphore(config.concurrency)

    async def run_once(self) -> DeliveryPass:
        rows = await self._store.claim_due(self.config.batch, self.config.lease_sec, self.config.caps)
        if not rows:
            return DeliveryPass()
        states = await asyncio.gather(*(self._deliver(row) for row in rows))
        return DeliveryPass(
            delivered=states.count("DELIVERED"), retried=states.count("PENDING"), failed=states.count("FAILED")
        )

    async def send_now(self, delivery_id: UUID) -> tuple[str, Outcome]:
        """Send one delivery already claimed by the caller (a test send), once, and record the answer."""
        row = await self._store.delivery(delivery_id)
        if row is None:
            raise LookupError(f"delivery {delivery_id} not found")
        outcome = await self._send(row)
        state = "DELIVERED" if outcome.ok else "FAILED"
        await self._store.finish_delivery(delivery_id, row["attempts"], state, outcome.status, outcome.error)
        return state, outcome

    async def _deliver(self, row: Mapping[str, Any]) -> str:
        async with self._slots:
            outcome = await self._send(row)
        attempt: int = row["attempts"]
        if outcome.ok:
            state, delay = "DELIVERED", 0.0
        elif outcome.retryable and attempt < self.config.retry.max_attempts:
            state, delay = "PENDING", self.config.retry.delay_ms(attempt) / 1000
            asked = outcome.retry_after_sec
            if asked is not None and outcome.status in (429, 503) and asked <= self.config.retry.max_delay_ms / 1000:
                delay = max(delay, asked)
        else:
            state, delay = "FAILED", 0.0
        if not await self._store.finish_delivery(row["id"], attempt, state, outcome.status, outcome.error, delay):
            log.info("delivery %s: its claim ran out before the answer came; the next claim sends it again", row["id"])
        return state

    async def _send(self, row: Mapping[str, Any]) -> Outcome:
        if row["url"].startswith(MAILTO):
            return await self._mail(row)
        cipher = await self._keyring.cipher(row["tenant_id"])
        secrets = cipher.open_json(row["secrets"], SECRETS)
        if not row["previous_secret_valid"]:
            secrets = secrets[:1]  # the newest; the previous one's overlap after a rotation is over
        request = OutboundRequest(
            url=row["url"],
            body=notification_body(row),
            msg_id=f"msg_{row['id']}",
            secrets=tuple(secrets),
            purpose="test" if row["event"] == "test" else "notification",
            allowed=tuple(ipaddress.ip_network(a) for a in row["allowed_addresses"] or ()),
        )
        return await self.sender.send(request)

    async def _mail(self, row: Mapping[str, Any]) -> Outcome:
        if row["email_confirmed_at"] is None:
            return Outcome(status=None, error=UNCONFIRMED, refused=True)
        if self.mail is None:
            return Outcome(status=None, error=NO_RELAY, refused=True)
        event = orjson.loads(notification_body(row))
        data = event["data"]
        about = data.get("jobName") or data.get("handler") or data.get("pool") or data["tenant"]
        body = (
            f"Sundial: {event['type']} ({about}) at {event['timestamp']}.\n\n"
            + orjson.dumps(event, option=orjson.OPT_INDENT_2).decode()
            + "\n"
        )
        return await send_mail(
            self.mail, row["url"][len(MAILTO) :], f"[Sundial] {event['type']}: {about}", body, f"msg_{row['id']}"
        )
