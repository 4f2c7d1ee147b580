"""When a gateway hands work out, and how its callers count as live workers, against the real servers: a pull answers
as soon as something is due (it never waits to fill ``max``, nor for a message published ahead of its due instant in
the same fetch); a message published ahead starts at its due instant, not before; a session that pulls is announced
as a live worker of its pool with what it says of itself, as a direct worker announces itself."""

from __future__ import annotations

import dataclasses
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from redis.asyncio import Redis
from sundial_common.hotwindow.worker_announcements import WorkerAnnouncements
from sundial_common.stores import Stores

from tests.integration.test_gateway import TENANT, bearer, gateway, pool_token
from tests.support.pools import admit
from tests.support.worker import dispatch, execution, produce_to

__all__ = ["gateway"]  # the fixture, imported for these tests

#: How far ahead of its due instant the held message is published: beyond a first group join on a loaded machine.
AHEAD = timedelta(seconds=4.5)


async def test_a_pull_answers_with_what_is_due_and_holds_what_was_published_ahead(
    gateway: tuple[httpx.AsyncClient, Any], stores: Stores, kafka_bootstrap: str, database_url: str
) -> None:
    http, _app = gateway
    pool = admit(database_url, f"gwt-{uuid.uuid4().hex[:8]}", TENANT)
    token = await pool_token(stores, pool)
    early, later = await dispatch(stores, pool, "echo", [{"n": "later"}, {"n": "now"}], tenant=TENANT)
    due = datetime.now(UTC) + AHEAD
    ahead = dataclasses.replace(early, due_at=due.isoformat())
    # One partition, the message due later first: a fetch takes both.
    produce_to(kafka_bootstrap, 0, [ahead, later])

    body = {"session": "session-timing", "max": 10, "waitMs": 20_000}
    first = await http.post("/v1/worker/pull", json=body, headers=bearer(token))
    answered_at = datetime.now(UTC)
    assert first.status_code == 200, first.text
    assert [lease["payload"]["n"] for lease in first.json()["executions"]] == ["now"], (
        "the due execution comes alone: not held for the one due later, nor for max to fill"
    )
    assert answered_at < due, "answered before the message published ahead was due"
    assert (await execution(stores, ahead))["state"] == "PENDING", "a message published ahead is not started early"

    second = await http.post("/v1/worker/pull", json=body, headers=bearer(token))
    assert second.status_code == 200, second.text
    assert [lease["payload"]["n"] for lease in second.json()["executions"]] == ["later"]
    started = (await execution(stores, ahead))["started_at"]
    assert due <= started < due + timedelta(seconds=2), f"started at {started}, due at {due}"


async def test_a_pulling_session_is_announced_as_a_live_worker(
    gateway: tuple[httpx.AsyncClient, Any], stores: Stores, redis_url: str, database_url: str
) -> None:
    http, _app = gateway
    pool = admit(database_url, f"gwp-{uuid.uuid4().hex[:8]}", TENANT)
    token = await pool_token(stores, pool)
    redis = Redis.from_url(redis_url)
    try:
        announcements = WorkerAnnouncements(redis)
        assert await announcements.live(pool) == []

        said = {"concurrency": 64, "freeSlots": 60, "handlers": ["echo", "resize"], "version": "9.9.9"}
        body = {"session": "session-said", "max": 30, "waitMs": 0, "worker": said}
        began = time.monotonic()
        answer = await http.post("/v1/worker/pull", json=body, headers=bearer(token))
        assert answer.status_code == 200, answer.text
        assert time.monotonic() - began < 5, "waitMs 0 answers at once"
        silent = {"session": "session-silent", "max": 8, "waitMs": 0}
        assert (await http.post("/v1/worker/pull", json=silent, headers=bearer(token))).status_code == 200

        live = {w.worker_id.rsplit(":", 1)[-1]: w for w in await announcements.live(pool)}
        assert set(live) == {"session-said", "session-silent"}
        one = live["session-said"]
        assert (one.concurrency, one.free_slots, one.handlers, one.version) == (64, 60, ("echo", "resize"), "9.9.9")
        assert one.worker_id.startswith("gw:") and one.pool == pool
        other = live["session-silent"]
        assert (other.concurrency, other.free_slots, other.handlers) == (8, 8, ())

        # A worker's account of itself that does not add up is refused, naming the field.
        wrong = {**body, "worker": {**said, "freeSlots": 65}}
        refused = await http.post("/v1/worker/pull", json=wrong, headers=bearer(token))
        assert refused.status_code == 422 and "worker" in refused.json()["errors"][0]["field"], refused.text
    finally:
        await redis.aclose()
