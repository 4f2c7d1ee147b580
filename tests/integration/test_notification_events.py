"""The operation and pool events end to end in process: ``backfill.finished``, ``replay.finished``,
``bulk.finished`` (the sweeper's scan of finished operations) and ``pool.unserved`` / ``pool.served`` (its judge
of pools with work and no live worker), delivered by the API to a real receiver on 127.0.0.1."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from redis.asyncio import Redis
from standardwebhooks import Webhook
from sundial_common.hotwindow.worker_announcements import WorkerAnnouncement, WorkerAnnouncements
from sundial_common.stores import Stores
from sundial_sweeper.finished_operations import FinishedOperations, FinishedOperationsConfig
from sundial_sweeper.pool_episodes import PoolEpisodes, PoolEpisodesConfig, PoolEpisodesPass

from tests.integration.test_notifications import LOOPBACK_ALLOWED, deliveries_of, subscribe
from tests.integration.test_reliability import make_executions
from tests.support.api import TENANT, Api, api  # noqa: F401  (the `api` fixture)
from tests.support.pools import admit
from tests.support.webhook_receiver import WebhookReceiver, running_receiver
from tests.support.worker import wait_until


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    async with running_receiver() as r:
        yield r


async def _events(stack: Api, receiver: WebhookReceiver, secret: str, count: int) -> list[dict[str, Any]]:
    async def arrived() -> bool:
        await deliveries_of(stack).run_once()
        return len(receiver.received) >= count

    await wait_until(arrived, f"{count} notifications")
    return [Webhook(secret).verify(r.body, r.headers) for r in receiver.received]


@pytest.mark.parametrize("api", LOOPBACK_ALLOWED, indirect=True)
async def test_a_finished_backfill_replay_and_bulk_operation_are_told_once_with_their_counts(
    api: Api,  # noqa: F811
    receiver: WebhookReceiver,
    stores: Stores,
) -> None:
    pool = admit(api.settings.database_url, f"n-{uuid.uuid4().hex[:10]}", TENANT)
    created = await subscribe(api, receiver.url, events=["backfill.finished", "replay.finished", "bulk.finished"])
    watch = FinishedOperations(stores.notifications, FinishedOperationsConfig())
    messages = await make_executions(stores, pool, "nightly", 3)
    ids = [uuid.UUID(m.execution_id) for m in messages]
    job_id = await api.db.fetchval("SELECT job_id FROM executions WHERE id = $1", ids[0])
    backfill = uuid.uuid4()
    await api.db.execute(
        "INSERT INTO backfills (id, tenant_id, job_id, shard, range_from, range_to, overlap_policy, rate_per_sec,"
        " state, total, created, actor, finished_at)"
        " VALUES ($1, $2, $3, 0, now() - interval '3 days', now(), 'ALLOW', 10, 'DONE', 3, 3, 'ops', now())",
        backfill,
        TENANT,
        job_id,
    )
    await api.db.execute("UPDATE executions SET backfill_id = $1 WHERE id = ANY($2::uuid[])", backfill, ids)
    await api.db.execute("UPDATE executions SET state = 'SUCCEEDED' WHERE id = $1", ids[0])
    await api.db.execute("UPDATE executions SET state = 'DEAD' WHERE id = $1", ids[1])
    # Walked, but one of its executions still waits for a worker: the backfill is not over yet.
    assert await watch.run_once() == 0

    await api.db.execute("UPDATE executions SET state = 'SUCCEEDED' WHERE id = $1", ids[2])
    replay, bulk = uuid.uuid4(), uuid.uuid4()
    await api.db.execute(
        "INSERT INTO replays (id, tenant_id, created_by, source_pool, target_pool, window_from, window_to, state,"
        " scanned, matched, published, finished_at)"
        " VALUES ($1, $2, 'ops', $3, 'staging', now() - interval '1 hour', now(), 'SUCCEEDED', 40, 12, 12, now())",
        replay,
        TENANT,
        pool,
    )
    await api.db.execute(
        "INSERT INTO bulk_operations (id, tenant_id, created_by, target, action, filter, rate_per_sec, state, total,"
        " done, skipped, failed, finished_at)"
        " VALUES ($1, $2, 'ops', 'executions', 'redrive', '{}', 50, 'SUCCEEDED', 10, 7, 2, 1, now())",
        bulk,
        TENANT,
    )
    # Another tenant's operation is nobody's here.
    await api.db.execute(
        "INSERT INTO bulk_operations (id, tenant_id, created_by, target, action, filter, rate_per_sec, state, total,"
        " finished_at) VALUES ($1, 'other', 'ops', 'jobs', 'pause', '{}', 50, 'CANCELLED', 0, now())",
        uuid.uuid4(),
    )
    assert await watch.run_once() == 3
    assert await watch.run_once() == 0  # the next pass (or another sweeper) finds them recorded

    events = await _events(api, receiver, created["secret"], 3)
    by_type = {e["type"]: e["data"] for e in events}
    assert set(by_type) == {"backfill.finished", "replay.finished", "bulk.finished"}
    done = by_type["backfill.finished"]
    assert (done["operationId"], done["state"], done["jobId"], done["pool"]) == (
        str(backfill),
        "DONE",
        str(job_id),
        pool,
    )
    assert (done["total"], done["succeeded"], done["dead"], done["cancelled"]) == (3, 2, 1, 0)
    replayed = by_type["replay.finished"]
    assert (replayed["operationId"], replayed["matched"], replayed["published"]) == (str(replay), 12, 12)
    assert replayed["sourcePool"] == pool and replayed["pool"] == "staging"
    bulked = by_type["bulk.finished"]
    assert (bulked["operationId"], bulked["action"], bulked["done"], bulked["skipped"], bulked["failed"]) == (
        str(bulk),
        "redrive",
        7,
        2,
        1,
    )


def _worker(pool: str, worker_id: str = "w-1") -> WorkerAnnouncement:
    return WorkerAnnouncement(
        worker_id=worker_id,
        pool=pool,
        handlers=("nightly",),
        concurrency=4,
        free_slots=4,
        version="test",
        host="localhost",
        pid=1,
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


@pytest.mark.parametrize("api", LOOPBACK_ALLOWED, indirect=True)
async def test_a_pool_with_work_and_no_live_worker_is_one_episode_until_a_worker_appears(
    api: Api,  # noqa: F811
    receiver: WebhookReceiver,
    stores: Stores,
    redis_url: str,
) -> None:
    pool = admit(api.settings.database_url, f"n-{uuid.uuid4().hex[:10]}", TENANT)
    created = await subscribe(api, receiver.url, events=["pool.unserved", "pool.served"], pool=pool)
    redis = Redis.from_url(redis_url)
    announcements = WorkerAnnouncements(redis)
    clock = [0.0]
    judge = PoolEpisodes(stores.notifications, announcements, PoolEpisodesConfig(grace_sec=30), lambda: clock[0])
    standby = PoolEpisodes(stores.notifications, announcements, PoolEpisodesConfig(grace_sec=0))
    try:
        assert await judge.run_once() == PoolEpisodesPass()  # no work: nothing to judge
        await make_executions(stores, pool, "nightly", 2)
        assert await judge.run_once() == PoolEpisodesPass()  # unserved, but not for the grace yet
        clock[0] = 31.0
        assert await judge.run_once() == PoolEpisodesPass(opened=1)
        assert await judge.run_once() == PoolEpisodesPass()  # one episode, however many passes see it
        assert await standby.run_once() == PoolEpisodesPass()  # ... or sweepers

        await announcements.announce(_worker(pool), ttl_sec=30)
        assert await standby.run_once() == PoolEpisodesPass(closed=1)
        assert await judge.run_once() == PoolEpisodesPass()  # the other sweeper finds it closed
    finally:
        await redis.aclose()

    events = await _events(api, receiver, created["secret"], 2)
    assert sorted((e["type"], e["data"]["episode"], e["data"]["pool"]) for e in events) == [
        ("pool.served", 1, pool),
        ("pool.unserved", 1, pool),
    ]
    unserved = next(e["data"] for e in events if e["type"] == "pool.unserved")
    served = next(e["data"] for e in events if e["type"] == "pool.served")
    assert (unserved["pending"], unserved["liveWorkers"]) == (2, 0)
    assert served["liveWorkers"] == 1 and served["unservedSince"] == unserved["unservedSince"]
