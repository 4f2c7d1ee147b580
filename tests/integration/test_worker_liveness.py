"""A worker's liveness on real Postgres and Redis: its heartbeats, a handler that holds the event loop, a
restarted worker's lost attempts and an outcome that comes too late.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import pytest
from redis.asyncio import Redis
from sundial_common.broker.kafka import KafkaPublisher
from sundial_common.hotwindow.execution_signals import heartbeat_key
from sundial_common.stores import Stores
from sundial_worker import Context, Worker, WorkerRuntime
from sundial_worker.settings import WorkerSettings

from tests.support.sealed import opened_all
from tests.support.worker import (
    FAST,
    demo_worker,
    dispatch,
    execution,
    pool,
    publish,
    redis,
    serving,
    settings,
    wait_state,
    wait_until,
)

__all__ = ["pool", "redis", "settings"]  # the fixtures


async def test_heartbeat_renews_liveness_and_records_progress(
    stores: Stores, redis: Redis, publisher: KafkaPublisher, settings: WorkerSettings, pool: str
) -> None:
    checkpointed, release = asyncio.Event(), asyncio.Event()
    worker = Worker(pool=pool)

    @worker.handler("long")
    async def long(ctx: Context, payload: Any) -> None:
        await ctx.heartbeat(progress={"step": 1})
        checkpointed.set()
        await release.wait()

    async with serving(worker, settings) as runtime:
        [message] = await dispatch(stores, pool, "long", [{}])
        await publish(publisher, [message])
        await asyncio.wait_for(checkpointed.wait(), 20)
        key = heartbeat_key(message.execution_id)
        [attempt] = await opened_all(
            stores, await stores.executions.execution_attempts(uuid.UUID(message.execution_id))
        )
        assert attempt["progress"] == {"step": 1}
        assert await redis.get(key) == runtime.worker_id
        assert 0 < await redis.pttl(key) <= FAST.heartbeat_ttl_sec * 1000
        await redis.delete(key)  # as if it had expired: the periodic renewal must bring it back

        async def renewed() -> bool:
            return await redis.get(key) == runtime.worker_id

        await wait_until(renewed, "the periodic heartbeat to renew the key", within=5)
        release.set()
        await wait_state(stores, message, "SUCCEEDED")

        async def key_gone() -> bool:
            return not await redis.exists(key)

        await wait_until(key_gone, "the liveness key to be dropped once the outcome is written")


async def test_a_handler_holding_the_event_loop_does_not_make_its_worker_look_lost(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, redis_url: str, pool: str
) -> None:
    from redis import Redis as SyncRedis

    worker = Worker(pool=pool)
    blocked = threading.Event()

    @worker.handler("hog")
    async def hog(ctx: Context, payload: Any) -> None:
        blocked.set()
        time.sleep(payload["sec"])  # a badly written handler: blocks the event loop, never awaits

    ttl = 1.5
    async with serving(worker, settings, heartbeat_interval_sec=0.3, heartbeat_ttl_sec=ttl) as runtime:
        [message] = await dispatch(stores, pool, "hog", [{"sec": 3 * ttl}])
        key = heartbeat_key(message.execution_id)
        missing: list[float] = []
        sampled = 0
        watcher_redis = SyncRedis.from_url(redis_url)

        def watch() -> None:
            # The test's own event loop is the one the handler holds: sample from a thread.
            nonlocal sampled
            assert blocked.wait(30), "the handler never started"
            # Its first key may come from the thread's next pass (admission's own write waits for the loop).
            time.sleep(0.3 + 0.2)
            deadline = time.monotonic() + 3 * ttl - 1.0
            while time.monotonic() < deadline:
                if watcher_redis.get(key) != runtime.worker_id.encode():
                    missing.append(time.monotonic())
                sampled += 1
                time.sleep(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            await publish(publisher, [message])
            await asyncio.to_thread(watcher.join, 60)
        finally:
            watcher_redis.close()
        await wait_state(stores, message, "SUCCEEDED")
    # The key lived on through three TTLs of a frozen event loop: renewed by the liveness thread.
    assert sampled > 10 and not missing, f"liveness key missing in {len(missing)} of {sampled} samples"


async def test_a_restarted_worker_declares_its_previous_incarnations_attempts_lost(
    stores: Stores, redis: Redis, settings: WorkerSettings, pool: str
) -> None:
    worker_id = f"restarted-{uuid.uuid4().hex[:6]}"
    first = await stores.workers.begin_incarnation(worker_id, pool, "host", 1)
    # The first incarnation won two executions and died running them; another worker runs a third.
    orphaned = await dispatch(stores, pool, "echo", [{}, {}])
    elsewhere = await dispatch(stores, pool, "echo", [{}])
    ids = [uuid.UUID(m.execution_id) for m in orphaned]
    await stores.database.pool.execute("UPDATE executions SET max_attempts = 3 WHERE id = ANY($1::uuid[])", ids)
    await stores.executions.start_executions(worker_id, [(uuid.UUID(m.execution_id), 1) for m in orphaned])
    await stores.executions.start_executions("other-worker", [(uuid.UUID(elsewhere[0].execution_id), 1)])

    runtime = WorkerRuntime(demo_worker(pool), settings, config=FAST, worker_id=worker_id)
    began = time.monotonic()
    await runtime.start()
    try:
        started_in = time.monotonic() - began
        for message in orphaned:
            row = await execution(stores, message)
            # Ended before the new incarnation took any message: lost, and its retry already scheduled.
            assert row["state"] == "FAILED_WORKER_LOST" and row["next_attempt_at"] is not None, dict(row)
            assert f"restarted (incarnation {first.number + 1})" in row["error"]
        assert (await execution(stores, elsewhere[0]))["state"] == "RUNNING"  # not this worker's
        hot = set(await redis.zrange("sundial:{0}:hot", 0, -1))
        assert {f"r:{m.execution_id}" for m in orphaned} <= hot, hot
        [row] = await stores.database.pool.fetch(
            "SELECT incarnation FROM worker_incarnations WHERE worker_id = $1", worker_id
        )
        assert row["incarnation"] == first.number + 1
    finally:
        await runtime.stop()
    assert started_in < 10


async def test_a_late_outcome_is_rejected_and_leaves_the_new_owners_liveness_alone(
    stores: Stores,
    redis: Redis,
    publisher: KafkaPublisher,
    settings: WorkerSettings,
    pool: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    running, release = asyncio.Event(), asyncio.Event()
    worker = Worker(pool=pool)

    @worker.handler("slow")
    async def slow(ctx: Context, payload: Any) -> str:
        running.set()
        await release.wait()
        return "too late"

    # No periodic renewal during the test: it would legitimately overwrite the key the test plants.
    async with serving(worker, settings, heartbeat_interval_sec=60, heartbeat_ttl_sec=120) as runtime:
        [message] = await dispatch(stores, pool, "slow", [{}])
        await publish(publisher, [message])
        await asyncio.wait_for(running.wait(), 20)
        key = heartbeat_key(message.execution_id)

        async def own_liveness_set() -> bool:
            return bool(await redis.get(key) == runtime.worker_id)

        await wait_until(own_liveness_set, "the worker's own liveness key")
        # Meanwhile the sweeper decided this worker was lost and another worker took the execution.
        await stores.database.pool.execute(
            "UPDATE executions SET worker_id = 'other-worker' WHERE id = $1", uuid.UUID(message.execution_id)
        )
        await redis.set(key, "other-worker")
        release.set()

        async def rejected() -> bool:
            return runtime.stats.rejected == 1

        await wait_until(rejected, "the late outcome to be rejected")
    row = await execution(stores, message)
    assert (row["state"], row["worker_id"], row["result"]) == ("RUNNING", "other-worker", None)
    assert await redis.get(key) == "other-worker"
    assert any("late write rejected" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
