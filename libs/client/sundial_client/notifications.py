"""``client.notifications``: the tenant's webhook subscriptions, their delivery logs and test sends.

Written once, over asyncio; the blocking client runs these same methods on its own event loop.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from sundial_client import calls
from sundial_client.caller import Caller
from sundial_client.models.notifications import DeliveryView, SubscriptionView, TestSendView


class AsyncNotifications:
    """``client.notifications``."""

    def __init__(self, client: Caller) -> None:
        self.client = client

    async def subscribe(
        self,
        url: str | None,
        events: Sequence[str],
        *,
        email: str | None = None,
        pool: str | None = None,
        job_id: str | None = None,
        description: str | None = None,
    ) -> SubscriptionView:
        """A new subscription to a webhook ``url``, or (``url`` None) to an ``email`` address, which is sent a
        confirmation link first; its ``secret`` is in full here only: store it to verify signatures."""
        call = calls.create_subscription(url, events, email=email, pool=pool, job_id=job_id, description=description)
        return await self.client.call(call)

    async def list(self) -> list[SubscriptionView]:
        return (await self.client.call(calls.list_subscriptions())).items

    async def get(self, subscription_id: str) -> SubscriptionView:
        return await self.client.call(calls.get_subscription(subscription_id))

    async def delete(self, subscription_id: str) -> None:
        await self.client.call(calls.delete_subscription(subscription_id))

    async def rotate_secret(self, subscription_id: str, *, previous_valid_sec: int = 86_400) -> SubscriptionView:
        """A new secret (in full here only); the previous one still signs for ``previous_valid_sec`` seconds."""
        return await self.client.call(
            calls.rotate_subscription_secret(subscription_id, previous_valid_sec=previous_valid_sec)
        )

    async def deliveries(self, subscription_id: str, *, limit: int = 50) -> builtins.list[DeliveryView]:
        """The subscription's delivery log, newest first."""
        return (await self.client.call(calls.subscription_deliveries(subscription_id, limit=limit))).items

    async def test(self, subscription_id: str) -> TestSendView:
        """Send a signed ``test`` event now and return what the receiver answered."""
        return await self.client.call(calls.test_subscription(subscription_id))
