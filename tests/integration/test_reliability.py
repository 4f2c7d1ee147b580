"""Reliable execution on real Postgres, Redis and the broker: retries, cancellation, the sweeper's scans.

Components run in-process: the worker runtime as in ``test_worker``, the dispatcher, hydrator and sweeper one
``run_once()`` at a time. Every wait polls a condition against a deadline; the sweeper's
"missing for long enough" is driven by a fake monotonic clock, not by sleeping.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from redis.asyncio import Redis
from sundial_common.broker.kafka import KafkaPublisher, ensure_topics
from sundial_common.broker.messages import DLQ_TOPIC, ExecutionMessage, pool_topic
from sundial_common.hotwindow.execution_signals import cancel_key, heartbeat_key
from sundial_common.hotwindow.window import HotWindow, retry_member
from sundial_common.runtime.clock import to_ms
from sundial_common.stores import Stores
from sundial_common.stores.dispatch import FencedOut
from sundial_common.stores.executions import Outcome
from sundial_common.stores.types import Record, RetryDue
from sundial_common.testing import FakeClock
from sundial_dispatcher.dispatcher import DispatcherConfig, ShardDispatcher
from sundial_hydrator.hydrator import Hydrator, HydratorConfig
from sundial_sweeper.sweeper import Sweeper, SweeperConfig
from sundial_worker import Context, Worker, WorkerConfig, WorkerRuntime
from sundial_worker.settings import WorkerSettings

from tests.support.hot_window import window_members
from tests.support.pools import admit
from tests.support.sealed import opened, opened_all
from tests.support.worker import JOIN_SEC, dispatch, publish, wait_until

TENANT = "acme"
FAST = WorkerConfig(
    concurrency=8,
    heartbeat_interval_sec=0.3,
    heartbeat_ttl_sec=5.0,
    commit_interval_sec=0.1,
    shutdown_grace_sec=5.0,
    cancel_poll_interval_sec=0.1,
    cancel_grace_sec=1.0,
)
NO_JITTER_RETRY = {"maxAttempts": 3, "backoff": "FIXED", "initialDelayMs": 200, "maxDelayMs": 200, "jitter": False}


@pytest.fixture
def pool(database_url: str) -> str:
    # A worker runs only the work of tenants its pool admits (pool_guard): registered for the tests' tenant.
    return admit(database_url, f"r-{uuid.uuid4().hex[:10]}", TENANT)


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def settings(database_url: str, redis_url: str, kafka_bootstrap: str) -> WorkerSettings:
    return WorkerSettings(database_url=database_url, redis_url=redis_url, kafka_bootstrap=kafka_bootstrap, shards=1)


async def make_executions(
    stores: Stores,
    pool: str,
    handler: str,
    count: int = 1,
    *,
    retry_policy: dict[str, Any] | None = None,
    timeout_sec: int = 30,
) -> list[ExecutionMessage]:
    """Jobs due now in shard 0, named after their handler, dispatched through the real fenced transaction (token 1)."""
    payloads: list[Any] = [{"i": i} for i in range(count)]
    return await dispatch(
        stores, pool, handler, payloads, retry_policy=retry_policy, timeout_sec=timeout_sec, name=handler
    )


async def row_of(stores: Stores, message: ExecutionMessage | uuid.UUID) -> dict[str, Any]:
    ident = message if isinstance(message, uuid.UUID) else uuid.UUID(message.execution_id)
    row = await opened(stores, await stores.executions.get_execution(TENANT, ident))
    assert row is not None
    return row


async def reaches(stores: Stores, message: ExecutionMessage, state: str, within: float = 20.0) -> Record:
    async def reached() -> bool:
        return bool((await row_of(stores, message))["state"] == state)

    await wait_until(reached, f"execution {message.execution_id} to be {state}", within)
    return await row_of(stores, message)


async def serving(worker: Worker, settings: WorkerSettings, **config: Any) -> WorkerRuntime:
    runtime = WorkerRuntime(
        worker, settings, config=dataclasses.replace(FAST, **config), worker_id=f"test-{uuid.uuid4().hex[:6]}"
    )
    await runtime.start()
    await asyncio.wait_for(runtime.ready.wait(), JOIN_SEC)
    return runtime


def dispatcher(stores: Stores, redis: Redis, publisher: KafkaPublisher, token: int = 5) -> ShardDispatcher:
    return ShardDispatcher(
        0, token, f"leader-{token}", stores.dispatch, HotWindow(redis), publisher, DispatcherConfig(shards=1)
    )


def consume(bootstrap: str, topic: str, wanted: set[str], timeout: float = 15.0) -> list[ExecutionMessage]:
    """Messages of ``topic`` (from the start) until every execution id in ``wanted`` has been seen."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex}"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        seen: list[ExecutionMessage] = []
        deadline = time.monotonic() + timeout
        while not wanted <= {m.execution_id for m in seen} and time.monotonic() < deadline:
            for raw in consumer.consume(num_messages=100, timeout=0.3):
                value = raw.value()
                if raw.error() is None and value is not None:
                    seen.append(ExecutionMessage.decode(value))
        return [m for m in seen if m.execution_id in wanted]
    finally:
        consumer.close()


# --- retries: worker → hot window → dispatcher → worker -------------------------------------------


async def test_a_failed_attempt_schedules_its_retry_with_the_jobs_backoff_in_the_hot_window(
    stores: Stores, redis: Redis, publisher: KafkaPublisher, settings: WorkerSettings, pool: str
) -> None:
    worker = Worker(pool=pool)

    @worker.handler("boom")
    async def boom(ctx: Context, payload: Any) -> None:
        raise ValueError("downstream said no")

    policy = {"maxAttempts": 3, "backoff": "FIXED", "initialDelayMs": 60_000, "maxDelayMs": 60_000, "jitter": False}
    runtime = await serving(worker, settings)
    try:
        [message] = await make_executions(stores, pool, "boom", retry_policy=policy)
        await publish(publisher, [message])
        row = await reaches(stores, message, "FAILED")
    finally:
        await runtime.stop()
    # Scheduled by Postgres' clock, one backoff after the attempt ended.
    assert row["next_attempt_at"] - row["finished_at"] == timedelta(seconds=60)
    assert row["attempt"] == 1 and row["error"] == "ValueError: downstream said no"
    score = await redis.zscore(HotWindow(redis).key(0), retry_member(row["id"]))
    assert score == to_ms(row["next_attempt_at"])
    [attempt] = await opened_all(stores, await stores.executions.execution_attempts(row["id"]))
    assert (attempt["state"], attempt["error"]) == ("FAILED", "ValueError: downstream said no")
    assert runtime.stats.retries_scheduled == 1


async def test_the_next_attempt_is_dispatched_fenced_and_resumes_from_the_last_checkpoint(
    stores: Stores, redis: Redis, publisher: KafkaPublisher, settings: WorkerSettings, pool: str
) -> None:
    seen: list[tuple[int, Any, int]] = []
    worker = Worker(pool=pool)

    @worker.handler("resumable")
    async def resumable(ctx: Context, payload: Any) -> dict[str, int]:
        seen.append((ctx.attempt, ctx.previous_progress, ctx.fence_token))
        if ctx.attempt == 1:
            await ctx.heartbeat(progress={"done": 7})
            raise RuntimeError("crashed half way")
        assert ctx.previous_progress is not None, "the first attempt's progress comes back"
        return {"resumed_from": ctx.previous_progress["done"]}

    leader = dispatcher(stores, redis, publisher, token=5)
    runtime = await serving(worker, settings)
    try:
        [message] = await make_executions(stores, pool, "resumable", retry_policy=NO_JITTER_RETRY)
        await publish(publisher, [message])
        await reaches(stores, message, "FAILED")

        async def retried() -> bool:
            return (await leader.run_once()).retried == 1

        await wait_until(retried, "the dispatcher to claim the due retry")
        row = await reaches(stores, message, "SUCCEEDED")
    finally:
        await runtime.stop()
    assert seen == [(1, None, 1), (2, {"done": 7}, 5)]
    assert (row["attempt"], row["fence_token"], row["result"]) == (2, 5, {"resumed_from": 7})
    attempts = await opened_all(stores, await stores.executions.execution_attempts(row["id"]))
    assert [(a["attempt"], a["state"], a["progress"]) for a in attempts] == [
        (1, "FAILED", {"done": 7}),
        (2, "SUCCEEDED", None),
    ]
    audit = await stores.database.pool.fetch(
        "SELECT action, from_state, to_state, detail FROM audit_log WHERE entity_id = $1 ORDER BY id", row["id"]
    )
    assert [(a["action"], a["from_state"], a["to_state"]) for a in audit] == [
        ("dispatch", None, "PENDING"),
        ("start", "PENDING", "RUNNING"),
        ("finish", "RUNNING", "FAILED"),
        ("retry", "FAILED", "PENDING"),
        ("start", "PENDING", "RUNNING"),
        ("finish", "RUNNING", "SUCCEEDED"),
    ]
    assert audit[3]["detail"] == {"attempt": 2, "fenceToken": 5}


async def test_the_last_failed_attempt_leaves_the_execution_dead(
    stores: Stores, redis: Redis, publisher: KafkaPublisher, settings: WorkerSettings, pool: str
) -> None:
    worker = Worker(pool=pool)

    @worker.handler("never")
    async def never(ctx: Context, payload: Any) -> None:
        raise RuntimeError(f"attempt {ctx.attempt}")

    leader = dispatcher(stores, redis, publisher)
    runtime = await serving(worker, settings)
    try:
        [message] = await make_executions(stores, pool, "never", retry_policy={**NO_JITTER_RETRY, "maxAttempts": 2})
        await publish(publisher, [message])
        await reaches(stores, message, "FAILED")

        async def retried() -> bool:
            return (await leader.run_once()).retried == 1

        await wait_until(retried, "the retry to be dispatched")
        row = await reaches(stores, message, "DEAD")
    finally:
        await runtime.stop()
    assert (row["attempt"], row["next_attempt_at"], row["error"]) == (2, None, "RuntimeError: attempt 2")
    assert [a["state"] for a in await stores.executions.execution_attempts(row["id"])] == ["FAILED", "FAILED"]
    assert runtime.stats.dead == 1


async def test_retries_are_claimed_only_when_due_and_a_stale_leader_cannot_dispatch_them(
    stores: Stores, redis: Redis, publisher: KafkaPublisher, pool: str, kafka_bootstrap: str
) -> None:
    ensure_topics(kafka_bootstrap, [pool_topic(pool)])
    messages = await make_executions(stores, pool, "echo", 3, retry_policy=NO_JITTER_RETRY)
    ids = [uuid.UUID(m.execution_id) for m in messages]
    # Three failed attempts: one retry due, one due in an hour, one cancelled while it waited.
    await stores.database.pool.execute(
        "UPDATE executions SET state = 'FAILED', worker_id = 'w', next_attempt_at = now() - interval '1 second'"
        " WHERE id = ANY($1)",
        ids,
    )
    await stores.database.pool.execute(
        "UPDATE executions SET next_attempt_at = now() + interval '1 hour' WHERE id = $1", ids[1]
    )
    await stores.executions.cancel_execution(TENANT, ids[2], "test")
    window = HotWindow(redis)
    now = datetime.now(UTC)
    # Members for all three, claimed now: one due, one that raced ahead of its re-scheduled retry, one for
    # the execution cancelled while it waited.
    members = [RetryDue(r, now) for r in ids]
    await window.add_retries(0, members)
    stale = dispatcher(stores, redis, publisher, token=3)
    await stores.database.pool.execute(
        "UPDATE shard_fence SET token = 4, holder = 'newer' WHERE shard = 0"
    )  # a newer term
    with pytest.raises(FencedOut):
        await stale.run_once()
    assert (await row_of(stores, ids[0]))["state"] == "FAILED"  # the stale leader wrote nothing

    await window.add_retries(0, members)  # the stale leader's claim took them; the hydrator would put them back
    result = await dispatcher(stores, redis, publisher, token=4).run_once()
    assert result.retried == 1
    first, later, cancelled = [await row_of(stores, r) for r in ids]
    assert (first["state"], first["attempt"], first["fence_token"], first["next_attempt_at"]) == ("PENDING", 2, 4, None)
    assert (later["state"], later["attempt"]) == ("FAILED", 1)
    assert cancelled["state"] == "CANCELLED"
    # The early member went back where its retry is due; the cancelled one is gone for good.
    assert await redis.zscore(window.key(0), retry_member(ids[1])) == to_ms(later["next_attempt_at"])
    assert await redis.zscore(window.key(0), retry_member(ids[2])) is None
    [sent] = await asyncio.to_thread(consume, kafka_bootstrap, pool_topic(pool), {str(ids[0])})
    assert (sent.attempt, sent.fence_token) == (2, 4)


async def test_the_hydrator_promotes_scheduled_retries_and_rebuilds_them_after_a_flush(
    stores: Stores, redis: Redis, pool: str
) -> None:
    messages = await make_executions(stores, pool, "echo", 3, retry_policy=NO_JITTER_RETRY)
    ids = [uuid.UUID(m.execution_id) for m in messages]
    await stores.database.pool.execute(
        "UPDATE executions SET state = 'FAILED', next_attempt_at = now() + interval '10 minutes' WHERE id = $1", ids[0]
    )
    await stores.database.pool.execute(
        "UPDATE executions SET state = 'FAILED', next_attempt_at = now() + interval '2 hours' WHERE id = $1", ids[1]
    )
    # Overdue: its member was claimed by a dispatcher that died before committing.
    await stores.database.pool.execute(
        "UPDATE executions SET state = 'TIMED_OUT', next_attempt_at = now() - interval '1 minute' WHERE id = $1", ids[2]
    )
    window = HotWindow(redis)
    hydrator = Hydrator(stores, window, HydratorConfig(shards=1, overdue_grace_sec=15))
    key = window.key(0)
    await hydrator.run_once()
    members = await window_members(redis, key)
    # The rebuild pass (no watermark yet) brings back everything due before the horizon, overdue included.
    assert members == {retry_member(ids[0]), retry_member(ids[2])}
    await redis.flushall()
    await hydrator.run_once()
    assert await window_members(redis, key) == members
    await redis.zrem(key, retry_member(ids[2]))
    hydrator._last_overdue_scan = float("-inf")  # the next overdue scan is due now
    await hydrator.run_once()
    assert await redis.zscore(key, retry_member(ids[2])) is not None


async def test_each_shards_retries_are_promoted_page_by_page_and_re_added_to_that_shard(
    stores: Stores, redis: Redis, pool: str
) -> None:
    # Two shards, three retries each due within the window (more than one page of 2) and one overdue each: one
    # statement pages through every shard at once, and each retry lands in its own shard's window.
    messages = await make_executions(stores, pool, "echo", 8, retry_policy=NO_JITTER_RETRY)
    ids = [uuid.UUID(m.execution_id) for m in messages]
    expected: dict[int, set[str]] = {0: set(), 1: set()}
    for i, execution_id in enumerate(ids):
        shard, overdue = i % 2, i >= 6
        await stores.database.pool.execute(
            "UPDATE executions SET state = 'FAILED', shard = $2, next_attempt_at = now() + $3 * interval '1 second' "
            "WHERE id = $1",
            execution_id,
            shard,
            -60 if overdue else 600 + i,
        )
        expected[shard].add(retry_member(execution_id))
    window = HotWindow(redis)
    hydrator = Hydrator(stores, window, HydratorConfig(shards=2, batch_size=2, overdue_grace_sec=15))
    await hydrator.run_once()
    for shard in (0, 1):
        assert await window_members(redis, window.key(shard)) == expected[shard]

    lost = {shard: retry_member(ids[6 + shard]) for shard in (0, 1)}
    for shard, member in lost.items():
        await redis.zrem(window.key(shard), member)
    hydrator._last_overdue_scan = float("-inf")  # the next overdue scan is due now
    await hydrator.run_once()
    for shard, member in lost.items():
        assert await redis.zscore(window.key(shard), member) is not None
        assert await redis.zscore(window.key(1 - shard), member) is None


# --- cancellation ------------------------------------------------------------------------------------


async def test_a_cancel_flag_interrupts_the_running_handler_within_a_second(
    stores: Stores, redis: Redis, publisher: KafkaPublisher, settings: WorkerSettings, pool: str
) -> None:
    started, saw = asyncio.Event(), asyncio.Event()
    worker = Worker(pool=pool)

    @worker.handler("long")
    async def long(ctx: Context, payload: Any) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if ctx.cancelled:
                saw.set()
            raise

    runtime = await serving(worker, settings)
    try:
        [message] = await make_executions(stores, pool, "long", retry_policy=NO_JITTER_RETRY)
        await publish(publisher, [message])
        await asyncio.wait_for(started.wait(), 20)
        asked = time.monotonic()
        await redis.set(cancel_key(message.execution_id), "1")
        row = await reaches(stores, message, "CANCELLED", within=5)
        took = time.monotonic() - asked
    finally:
        await runtime.stop()
    assert saw.is_set() and took < 1.5, took
    assert row["next_attempt_at"] is None  # a cancelled execution is not retried
    [attempt] = await opened_all(stores, await stores.executions.execution_attempts(row["id"]))
    assert attempt["state"] == "CANCELLED"


async def test_a_handler_that_ignores_the_cancel_is_abandoned_after_the_grace(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str
) -> None:
    started, release = threading.Event(), threading.Event()
    saw_cancel: list[bool] = []
    worker = Worker(pool=pool)

    @worker.handler("stubborn")
    def stubborn(ctx: Context, payload: Any) -> None:  # a sync handler: its thread cannot be interrupted
        started.set()
        release.wait(30)
        saw_cancel.append(ctx.cancelled)

    runtime = await serving(worker, settings, cancel_grace_sec=0.5)
    try:
        [message] = await make_executions(stores, pool, "stubborn")
        await publish(publisher, [message])
        assert await asyncio.to_thread(started.wait, 20)
        # Only Postgres knows (as if the Redis flag was lost): the worker reads it at its heartbeat.
        await stores.executions.cancel_execution(TENANT, uuid.UUID(message.execution_id), "test")
        row = await reaches(stores, message, "CANCELLED", within=5)
        assert runtime.stats.abandoned_on_interrupt == 1 and runtime.stats.cancelled == 1
    finally:
        release.set()
        await runtime.stop()
    assert row["error"] == "Cancelled: the execution's cancel was requested"
    assert saw_cancel == [True]


# --- the sweeper ----------------------------------------------------------------------------------


async def running(stores: Stores, message: ExecutionMessage, worker_id: str, started_ago_sec: float) -> uuid.UUID:
    ident = uuid.UUID(message.execution_id)
    assert len(await stores.executions.start_executions(worker_id, [(ident, 1)])) == 1
    await stores.database.pool.execute(
        "UPDATE executions SET started_at = now() - $2 * interval '1 second' WHERE id = $1", ident, started_ago_sec
    )
    return ident


async def test_the_sweeper_declares_a_worker_lost_only_once_its_heartbeat_stayed_missing(
    stores: Stores, redis: Redis, publisher: KafkaPublisher, pool: str
) -> None:
    [message] = await make_executions(stores, pool, "echo", retry_policy=NO_JITTER_RETRY, timeout_sec=600)
    ident = await running(stores, message, "w1", started_ago_sec=120)
    clock = FakeClock(datetime.now(UTC))
    config = SweeperConfig(heartbeat_ttl_sec=30, lost_confirm_sec=10)
    sweeper = Sweeper(stores, publisher, config, clock, redis=redis)

    await redis.set(heartbeat_key(ident), "w1")
    assert (await sweeper.run_once()).suspected == 0
    # Redis flushed: the key is gone but the worker is alive and renews it before the confirmation runs out.
    await redis.flushall()
    assert (await sweeper.run_once()).suspected == 1
    clock.advance(5)
    await redis.set(heartbeat_key(ident), "w1")
    assert (await sweeper.run_once()).lost == 0
    # The worker died: its key expires and stays missing.
    await redis.delete(heartbeat_key(ident))
    await sweeper.run_once()
    clock.advance(9)
    assert (await sweeper.run_once()).lost == 0
    clock.advance(2)
    assert (await sweeper.run_once()).lost == 1
    row = await row_of(stores, ident)
    assert (row["state"], row["worker_id"]) == ("FAILED_WORKER_LOST", "w1")
    assert row["next_attempt_at"] - row["finished_at"] == timedelta(milliseconds=200)
    assert row["error"] == "WorkerLost: worker w1 stopped renewing its heartbeat"
    [attempt] = await opened_all(stores, await stores.executions.execution_attempts(ident))
    assert attempt["state"] == "FAILED_WORKER_LOST"
    assert await redis.zscore(HotWindow(redis).key(0), retry_member(ident)) == to_ms(row["next_attempt_at"])
    # The late worker wakes up and reports: its write is rejected, the retry stands.
    assert await stores.executions.finish_executions("w1", [Outcome(ident, 1, "SUCCEEDED", {"late": True})]) == set()
    assert (await row_of(stores, ident))["state"] == "FAILED_WORKER_LOST"


async def test_the_sweeper_times_out_an_attempt_its_worker_never_ended(
    stores: Stores, redis: Redis, publisher: KafkaPublisher, pool: str
) -> None:
    [message] = await make_executions(stores, pool, "echo", timeout_sec=2)  # maxAttempts 1
    ident = await running(stores, message, "w1", started_ago_sec=30)
    await redis.set(heartbeat_key(ident), "w1")  # alive, but hung past its timeout
    sweeper = Sweeper(stores, publisher, SweeperConfig(timeout_grace_sec=5), redis=redis)
    assert (await sweeper.run_once()).timed_out == 1
    row = await row_of(stores, ident)
    assert row["state"] == "DEAD" and row["error"].startswith("TimeoutError: the attempt ran past timeoutSec=2")
    assert [a["state"] for a in await stores.executions.execution_attempts(ident)] == ["TIMED_OUT"]


async def test_dead_executions_are_published_to_the_dead_letter_topic_once(
    stores: Stores, publisher: KafkaPublisher, pool: str, kafka_bootstrap: str
) -> None:
    ensure_topics(kafka_bootstrap, [DLQ_TOPIC])
    [message] = await make_executions(stores, pool, "echo")
    ident = uuid.UUID(message.execution_id)
    await stores.database.pool.execute(
        "UPDATE executions SET state = 'DEAD', error = 'RuntimeError: x', finished_at = now() WHERE id = $1", ident
    )
    sweeper = Sweeper(stores, publisher, SweeperConfig())
    assert (await sweeper.run_once()).dead_lettered == 1
    assert (await sweeper.run_once()).dead_lettered == 0
    [letter] = await asyncio.to_thread(consume, kafka_bootstrap, DLQ_TOPIC, {str(ident)})
    assert (letter.tenant_id, letter.pool, letter.handler) == (TENANT, pool, "echo")


async def test_a_finish_written_again_finds_its_own_outcome_not_another_actors(stores: Stores, pool: str) -> None:
    [message] = await make_executions(stores, pool, "echo")
    ident = await running(stores, message, "w1", started_ago_sec=1)
    outcome = Outcome(ident, 1, "SUCCEEDED", {"n": 1})
    assert await stores.executions.finish_executions("w1", [outcome]) == {ident}
    # Its reply lost (Postgres restarted between commit and answer), the worker writes it again: refused, and
    # recognised as its own rather than another actor's.
    assert await stores.executions.finish_executions("w1", [outcome]) == set()
    assert await stores.executions.attempts_ended_by("w1", [outcome]) == {ident: "SUCCEEDED"}
    assert await stores.executions.attempts_ended_by("w2", [outcome]) == {}


async def test_an_attempt_another_actor_ended_is_not_taken_for_the_workers_own_finish(
    stores: Stores, pool: str
) -> None:
    [message] = await make_executions(stores, pool, "echo")
    ident = await running(stores, message, "w1", started_ago_sec=1)
    # What the sweeper does to a lost worker's attempt: it ends it, without any finish of w1's.
    await stores.database.pool.execute(
        "UPDATE execution_attempts SET state = 'FAILED_WORKER_LOST', finished_at = now() WHERE execution_id = $1",
        ident,
    )
    await stores.database.pool.execute("UPDATE executions SET state = 'FAILED' WHERE id = $1", ident)
    late = Outcome(ident, 1, "SUCCEEDED", {"late": True})
    assert await stores.executions.finish_executions("w1", [late]) == set()
    assert await stores.executions.attempts_ended_by("w1", [late]) == {}
