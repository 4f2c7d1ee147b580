"""The caps on notification deliveries, per tenant and per destination, as the API replicas' claims obey them:
on the requests in flight and on the requests sent in the last minute, whichever replica claims."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

from sundial_common.stores import Stores
from sundial_common.stores.notifications import DeliveryCaps, Incident, NewSubscription
from sundial_common.stores.types import Record

LEASE_SEC = 120.0
A, B, C = "https://a.example/hook", "https://b.example/hook", "https://c.example/hook"


def caps(**tight: int) -> DeliveryCaps:
    loose = {"tenant_concurrency": 1000, "destination_concurrency": 1000, "tenant_per_minute": 1000}
    return DeliveryCaps(**{**loose, "destination_per_minute": 1000, **tight})


async def setup(stores: Stores, tenant: str, urls: list[str], deaths: int) -> None:
    for url in urls:
        await stores.notifications.create_subscription(
            NewSubscription(tenant_id=tenant, created_by="test", events=("execution.dead",), url=url, sealed_secrets=[])
        )
    await stores.notifications.record_incidents(
        [
            Incident(tenant_id=tenant, event="execution.dead", incident_key=f"execution.dead:{uuid.uuid4()}", pool="p")
            for _ in range(deaths)
        ]
    )


async def answer_later(stores: Stores, rows: list[Record]) -> None:
    """Each claimed attempt answered 503: due again at once, its send still counted in this minute."""
    for row in rows:
        assert await stores.notifications.finish_delivery(row["id"], row["attempts"], "PENDING", 503, None, 0.0)


def per_url(rows: list[Record]) -> Counter[str]:
    return Counter(row["url"] for row in rows)


async def test_claims_stop_at_the_caps_in_flight_and_per_minute(stores: Stores) -> None:
    notifications = stores.notifications
    await setup(stores, "t1", [A, B], 6)  # 6 deliveries to A, 6 to B
    await setup(stores, "t2", [C], 6)  # 6 to C

    # In flight, at most 3 per tenant and 2 per destination: t1 gets 3 of its 12, t2 2 (its destination's cap).
    in_flight = caps(tenant_concurrency=3, destination_concurrency=2)
    first = await notifications.claim_due(100, LEASE_SEC, in_flight)
    assert Counter(row["tenant_id"] for row in first) == {"t1": 3, "t2": 2}
    assert max(per_url(first).values()) == 2
    assert await notifications.claim_due(100, LEASE_SEC, in_flight) == []  # all in flight: nothing more
    # One answered: its destination has room for one more, and only it.
    done = next(row for row in first if row["url"] == C)
    assert await notifications.finish_delivery(done["id"], done["attempts"], "DELIVERED", 204, None)
    [more] = await notifications.claim_due(100, LEASE_SEC, in_flight)
    assert more["url"] == C
    await answer_later(stores, [row for row in first if row["id"] != done["id"]] + [more])

    # Per minute, at most 4 per destination: the sends of this minute count, retries of one delivery included.
    sent = per_url(first) + Counter({C: 1})  # C: 3, A and B: 3 between them
    second = await notifications.claim_due(100, LEASE_SEC, caps(destination_per_minute=4))
    assert per_url(second) == {A: 4 - sent[A], B: 4 - sent[B], C: 1}
    await answer_later(stores, second)
    assert await notifications.claim_due(100, LEASE_SEC, caps(destination_per_minute=4)) == []

    # Per minute, at most 10 per tenant: t1 sent 8, t2 4.
    third = await notifications.claim_due(100, LEASE_SEC, caps(tenant_per_minute=10))
    assert Counter(row["tenant_id"] for row in third) == {"t1": 2, "t2": 5}  # t2 has 5 deliveries left


async def test_replicas_claiming_at_once_fill_a_cap_once(stores: Stores) -> None:
    await setup(stores, "t1", ["https://d.example/hook"], 20)
    claims = await asyncio.gather(
        *(stores.notifications.claim_due(100, LEASE_SEC, caps(destination_concurrency=5)) for _ in range(4))
    )
    assert sorted(len(rows) for rows in claims) == [0, 0, 0, 5]
