"""The worker runtime on real Postgres, Redis and the broker.

Work is produced the way the dispatcher produces it: a job row, the fenced dispatch transaction that
creates its PENDING execution, then an ``ExecutionMessage`` on the pool's topic. Each test has a pool
(so a topic and a consumer group) of its own, because topics outlive a test in the session's broker.
Every wait is a condition polled against a deadline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_INVALID, Consumer, Producer, TopicPartition
from opentelemetry import propagate
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from redis.asyncio import Redis
from sundial_common.broker.kafka import KafkaPublisher, Publisher
from sundial_common.broker.messages import ExecutionMessage, pool_topic
from sundial_common.broker.wakeups import WakingPublisher
from sundial_common.domain.ids import new_id
from sundial_common.hotwindow.execution_signals import heartbeat_key
from sundial_common.observability.tracing import trace_id_hex, traceparent, tracer
from sundial_common.runtime.clock import from_ms, to_ms
from sundial_common.stores import Stores
from sundial_common.stores.dispatch import PlannedExecution
from sundial_common.stores.executions import PostgresExecutionStore
from sundial_common.stores.types import Occurrence, Record
from sundial_worker import Context, Worker, WorkerConfig, WorkerRuntime
from sundial_worker import demo as demo_app
from sundial_worker.consumer import KafkaExecutionConsumer, consumer_group
from sundial_worker.settings import WorkerSettings

from tests.support.pools import admit
from tests.support.sealed import opened, opened_all

TENANT = "acme"
FAST = WorkerConfig(
    concurrency=8,
    heartbeat_interval_sec=0.5,
    heartbeat_ttl_sec=5.0,
    commit_interval_sec=0.1,
    shutdown_grace_sec=10.0,
)
JOIN_SEC = 30.0  # a fresh consumer group on tansu needs ~half the session timeout to get partitions


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture
def pool(database_url: str) -> str:
    # A worker runs only the work of tenants its pool admits (pool_guard): registered for the tests' tenant.
    return admit(database_url, f"w-{uuid.uuid4().hex[:10]}", TENANT)


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
def settings(database_url: str, redis_url: str, kafka_bootstrap: str) -> WorkerSettings:
    return WorkerSettings(database_url=database_url, redis_url=redis_url, kafka_bootstrap=kafka_bootstrap)


# --- helpers ------------------------------------------------------------------------------------


@asynccontextmanager
async def serving(worker: Worker, settings: WorkerSettings, **config: Any) -> AsyncIterator[WorkerRuntime]:
    """A started runtime that owns its partitions; stopped (gracefully) on exit."""
    runtime = WorkerRuntime(
        worker, settings, config=dataclasses.replace(FAST, **config), worker_id=f"test-{uuid.uuid4().hex[:6]}"
    )
    await runtime.start()
    try:
        await asyncio.wait_for(runtime.ready.wait(), JOIN_SEC)
        yield runtime
    finally:
        await runtime.stop()


async def dispatch(
    stores: Stores,
    pool: str,
    handler: str,
    payloads: list[Any],
    *,
    timeout_sec: int = 30,
    traceparent_value: str | None = None,
    tenant: str = TENANT,
    message_tenant: str | None = None,
) -> list[ExecutionMessage]:
    """Jobs due now, dispatched through the real fenced transaction: PENDING executions and their messages."""
    due = from_ms(to_ms(datetime.now(UTC)))  # fire times are compared at millisecond precision
    occurrences = []
    for payload in payloads:
        job_id = new_id()
        await stores.jobs.insert_job(
            {
                "id": job_id,
                "tenant_id": tenant,
                "name": f"{handler}-test",
                "type": "ONE_SHOT",
                "run_at": due,
                "pool": pool,
                "handler": handler,
                "payload": payload,
                "timeout_sec": timeout_sec,
                "shard": 0,
                "next_fire_at": due,
            },
            actor="test",
        )
        occurrences.append(Occurrence(job_id, due))

    def plan(rows: Any) -> list[PlannedExecution]:
        return [PlannedExecution(new_id(), row, None, traceparent_value) for row in rows]

    planned = await stores.dispatch.dispatch(0, 1, "test", occurrences, plan)
    assert len(planned) == len(payloads)
    return [
        ExecutionMessage(
            execution_id=str(p.execution_id),
            job_id=str(p.job["id"]),
            tenant_id=message_tenant or tenant,
            pool=pool,
            handler=handler,
            attempt=1,
            fence_token=1,
            scheduled_for=p.job["next_fire_at"].isoformat(),
            timeout_sec=timeout_sec,
            payload=p.job["payload"],
            traceparent=traceparent_value,
        )
        for p in planned
    ]


async def publish(publisher: Publisher, messages: list[ExecutionMessage]) -> None:
    errors = await publisher.publish(messages)
    assert errors == [None] * len(messages)


async def wait_until(predicate: Callable[[], Awaitable[bool]], what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:.0f}s waiting for {what}")
        await asyncio.sleep(0.05)


async def execution(stores: Stores, message: ExecutionMessage, tenant: str = TENANT) -> dict[str, Any]:
    """The execution's row, its sealed values opened."""
    row = await opened(stores, await stores.executions.get_execution(tenant, uuid.UUID(message.execution_id)))
    assert row is not None
    return row


async def wait_state(
    stores: Stores, message: ExecutionMessage, state: str, within: float = 20.0, tenant: str = TENANT
) -> Record:
    async def reached() -> bool:
        return bool((await execution(stores, message, tenant))["state"] == state)

    await wait_until(reached, f"execution {message.execution_id} to be {state}", within)
    return await execution(stores, message, tenant)


def produce_to(bootstrap: str, partition: int, messages: list[ExecutionMessage]) -> None:
    """Publish to one partition explicitly, to control the order messages sit in."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for m in messages:
        producer.produce(m.topic, m.encode(), key=m.execution_id.encode(), headers=m.headers(), partition=partition)
    assert producer.flush(10) == 0


def read_as_group(
    bootstrap: str, pool: str, until: Callable[[list[tuple[int, int, ExecutionMessage]]], bool], timeout: float
) -> list[tuple[int, int, ExecutionMessage]]:
    """Join the pool's consumer group as a new member and read (partition, offset, message) until ``until``."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": consumer_group(pool),
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            # The workers' protocol: a group's members must share one (cooperative and eager do not mix).
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": 3000,
            "heartbeat.interval.ms": 1000,
        }
    )
    seen: list[tuple[int, int, ExecutionMessage]] = []
    try:
        consumer.subscribe([pool_topic(pool)])
        deadline = time.monotonic() + timeout
        while not until(seen):
            if time.monotonic() > deadline:
                raise AssertionError(f"second group member saw only {[(p, o) for p, o, _ in seen]}")
            for m in consumer.consume(100, 0.2):
                if m.error() is None:
                    value, partition, offset = m.value(), m.partition(), m.offset()
                    assert value is not None and partition is not None and offset is not None
                    seen.append((partition, offset, ExecutionMessage.decode(value)))
    finally:
        consumer.close()
    return seen


def committed(bootstrap: str, pool: str, partitions: list[int]) -> dict[int, int]:
    """The group's committed offsets (OFFSET_INVALID = nothing committed); does not join the group."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": consumer_group(pool)})
    try:
        tps = consumer.committed([TopicPartition(pool_topic(pool), p) for p in partitions], timeout=10)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        consumer.close()


def demo_worker(pool: str, **kwargs: Any) -> Worker:
    """The demo app's handlers, served on a pool of this test's own."""
    worker = Worker(pool=pool, **kwargs)
    for name in ("echo", "fail", "sleep"):
        worker.handler(name)(demo_app.worker.handlers[name].func)
    return worker


# --- tests --------------------------------------------------------------------------------------


async def test_echo_succeeds_with_its_result_and_attempt_recorded(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str
) -> None:
    async with serving(demo_worker(pool), settings) as runtime:
        messages = await dispatch(stores, pool, "echo", [{"n": 1}, {"n": 2}, {"n": 3}])
        await publish(publisher, messages)
        rows = [await wait_state(stores, m, "SUCCEEDED") for m in messages]
    assert [row["result"] for row in rows] == [m.payload for m in messages]
    assert sorted(m.payload["n"] for m in messages) == [1, 2, 3]
    for row in rows:
        assert row["worker_id"] == runtime.worker_id
        assert row["error"] is None
        assert row["started_at"] <= row["finished_at"]
        [attempt] = await opened_all(stores, await stores.executions.execution_attempts(row["id"]))
        assert attempt["attempt"] == 1
        assert attempt["worker_id"] == runtime.worker_id
        assert attempt["state"] == "SUCCEEDED"
        assert attempt["started_at"] <= attempt["finished_at"]
    assert runtime.stats.started == 3 and runtime.stats.succeeded == 3


async def test_an_idle_worker_stops_fetching_and_still_starts_new_work_woken_or_not(
    stores: Stores, publisher: KafkaPublisher, redis: Redis, settings: WorkerSettings, pool: str
) -> None:
    """Idle, the consumer parks (its partitions paused: no broker fetch); a publish announced on Redis, and one that
    is not (the parked worker's own look every second finds it), both run."""
    async with serving(demo_worker(pool), settings) as runtime:
        consumer = runtime.consumer
        assert isinstance(consumer, KafkaExecutionConsumer)
        await runtime.ready.wait()

        async def parked() -> bool:
            return consumer._paused

        # Parked only once its partitions have settled (5 s after the assignment) and nothing came for 0.5 s.
        await wait_until(parked, "the idle consumer to park", within=30)
        announced = await dispatch(stores, pool, "echo", [{"n": 1}])
        await publish(WakingPublisher(publisher, redis), announced)
        await wait_state(stores, announced[0], "SUCCEEDED")
        await wait_until(parked, "the consumer to park again", within=30)
        silent = await dispatch(stores, pool, "echo", [{"n": 2}])
        await publish(publisher, silent)
        await wait_state(stores, silent[0], "SUCCEEDED")


async def test_a_message_of_a_tenant_the_pool_does_not_admit_never_reaches_the_handler(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str, database_url: str
) -> None:
    """Defence in depth: tenant B's work injected into A's topic (a forged or misrouted message) is refused by A's
    worker — the attempt FAILED with the reason, the handler never called — while A's own work runs."""
    calls: list[tuple[str, Any]] = []
    worker = Worker(pool=pool)

    @worker.handler("record")
    async def record(ctx: Context, payload: Any) -> None:
        calls.append((ctx.tenant, payload))

    admit(database_url, "b-pool", "intruder")  # registers tenant `intruder`; `pool` admits acme only
    async with serving(worker, settings, pool_cache_sec=0.2) as runtime:
        [foreign] = await dispatch(stores, pool, "record", [{"who": "b"}], tenant="intruder")
        # A message claiming to be acme's for an execution that is the intruder's: refused as well.
        [disguised] = await dispatch(stores, pool, "record", [{"who": "b2"}], tenant="intruder", message_tenant=TENANT)
        [own] = await dispatch(stores, pool, "record", [{"who": "a"}])
        await publish(publisher, [foreign, disguised, own])
        refused = [await wait_state(stores, m, "DEAD", tenant="intruder") for m in (foreign, disguised)]
        await wait_state(stores, own, "SUCCEEDED")
    assert calls == [(TENANT, {"who": "a"})]
    assert refused[0]["error"] == f"PoolRefused: pool '{pool}' is not open to tenant 'intruder'"
    assert refused[1]["error"].startswith("PoolRefused: the message claims tenant 'acme'")
    [attempt] = await stores.executions.execution_attempts(refused[0]["id"])
    assert attempt["state"] == "FAILED" and attempt["worker_id"] == runtime.worker_id
    assert runtime.stats.refused == 2 and runtime.stats.succeeded == 1
    # Audited: the execution's trail says which worker refused it, and why.
    trail = await stores.database.pool.fetch(
        "SELECT actor, detail FROM audit_log WHERE entity_id = $1 AND action = 'finish'", refused[0]["id"]
    )
    assert [(r["actor"], r["detail"]["errorClass"]) for r in trail] == [(runtime.worker_id, "PoolRefused")]


async def test_failing_handler_records_failed_with_type_and_message(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str
) -> None:
    async with serving(demo_worker(pool), settings):
        [message] = await dispatch(stores, pool, "fail", [{}])  # maxAttempts 1: no retry
        await publish(publisher, [message])
        row = await wait_state(stores, message, "DEAD")
    assert row["error"] == "RuntimeError: demo failure"
    assert row["result"] is None and row["next_attempt_at"] is None
    [attempt] = await opened_all(stores, await stores.executions.execution_attempts(row["id"]))
    assert (attempt["state"], attempt["error"]) == ("FAILED", "RuntimeError: demo failure")


async def test_unknown_handler_fails_with_a_clear_error(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str
) -> None:
    async with serving(demo_worker(pool), settings):
        [message] = await dispatch(stores, pool, "sned_email", [{}])
        await publish(publisher, [message])
        row = await wait_state(stores, message, "DEAD")
    assert row["error"] == f"UnknownHandler: pool '{pool}' has no handler 'sned_email' (registered: echo, fail, sleep)"


async def test_handler_over_its_timeout_is_cancelled_and_timed_out(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str
) -> None:
    cancelled = asyncio.Event()
    worker = Worker(pool=pool)

    @worker.handler("hang")
    async def hang(ctx: Context, payload: Any) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with serving(worker, settings):
        [message] = await dispatch(stores, pool, "hang", [{}], timeout_sec=1)
        await publish(publisher, [message])
        row = await wait_state(stores, message, "DEAD")
    assert cancelled.is_set()
    [attempt] = await opened_all(stores, await stores.executions.execution_attempts(row["id"]))
    assert attempt["state"] == "TIMED_OUT"
    assert row["error"] == "TimeoutError: handler 'hang' exceeded timeoutSec=1"
    assert (row["finished_at"] - row["started_at"]).total_seconds() >= 1


async def test_duplicate_and_stale_deliveries_do_not_run_the_handler_again(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str
) -> None:
    calls: list[uuid.UUID] = []
    worker = Worker(pool=pool)

    @worker.handler("count")
    async def count(ctx: Context, payload: Any) -> int:
        calls.append(ctx.execution_id)
        return len(calls)

    async with serving(worker, settings) as runtime:
        [message] = await dispatch(stores, pool, "count", [{}])
        await publish(publisher, [message, message])  # the broker delivered it twice
        await wait_state(stores, message, "SUCCEEDED")
        stale = dataclasses.replace(message, attempt=2)  # an attempt that is not the execution's current one
        await publish(publisher, [message, stale])

        async def all_seen() -> bool:
            return runtime.stats.consumed == 4 and runtime.stats.started + runtime.stats.duplicates == 4

        await wait_until(all_seen, "four deliveries to be handled")
    assert calls == [uuid.UUID(message.execution_id)]
    assert runtime.stats.started == 1 and runtime.stats.duplicates == 3
    assert (await execution(stores, message))["result"] == 1


async def test_a_redelivery_while_its_claim_is_in_flight_is_acknowledged_only_with_the_outcome(
    stores: Stores,
    settings: WorkerSettings,
    pool: str,
    kafka_bootstrap: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The same message on two partitions (a rebalance's redelivery): the second arrives while the first's start CAS
    # is still waiting for Postgres. It must run once, and its offset must not be committed while the handler runs
    # (acknowledged at once, a crash then would leave nothing to redeliver the running execution).
    cas_entered, cas_release, handler_release = asyncio.Event(), asyncio.Event(), asyncio.Event()
    real_start = PostgresExecutionStore.start_executions

    async def slow_start(self: PostgresExecutionStore, *args: Any, **kwargs: Any) -> list[Record]:
        cas_entered.set()
        await cas_release.wait()
        return await real_start(self, *args, **kwargs)

    monkeypatch.setattr(PostgresExecutionStore, "start_executions", slow_start)
    calls: list[uuid.UUID] = []
    worker = Worker(pool=pool)

    @worker.handler("held")
    async def held(ctx: Context, payload: Any) -> None:
        calls.append(ctx.execution_id)
        await handler_release.wait()

    async with serving(worker, settings) as runtime:
        [message] = await dispatch(stores, pool, "held", [{}])
        await asyncio.to_thread(produce_to, kafka_bootstrap, 0, [message])
        await asyncio.wait_for(cas_entered.wait(), 20)
        await asyncio.to_thread(produce_to, kafka_bootstrap, 1, [message])

        async def both_taken() -> bool:
            return runtime.stats.consumed == 2

        await wait_until(both_taken, "the redelivery to be taken while the claim is in flight")
        cas_release.set()
        await wait_state(stores, message, "RUNNING")
        await asyncio.sleep(10 * FAST.commit_interval_sec)  # commits run meanwhile
        assert await asyncio.to_thread(committed, kafka_bootstrap, pool, [0, 1]) == {
            0: OFFSET_INVALID,
            1: OFFSET_INVALID,
        }
        handler_release.set()
        await wait_state(stores, message, "SUCCEEDED")
    assert calls == [uuid.UUID(message.execution_id)]
    assert runtime.stats.started == 1 and runtime.stats.duplicates == 1
    assert await asyncio.to_thread(committed, kafka_bootstrap, pool, [0, 1]) == {0: 1, 1: 1}


async def test_sync_handler_runs_in_the_thread_pool(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str, spans: InMemorySpanExporter
) -> None:
    worker = Worker(pool=pool)

    @worker.handler("blocking")
    def blocking(ctx: Context, payload: Any) -> dict[str, Any]:
        time.sleep(0.05)  # a blocking call: it must not stall the event loop
        return {"thread": threading.current_thread().name, "doubled": payload["x"] * 2, "trace_id": ctx.trace_id}

    async with serving(worker, settings):
        [message] = await dispatch(stores, pool, "blocking", [{"x": 21}])
        await publish(publisher, [message])
        row = await wait_state(stores, message, "SUCCEEDED")
    assert row["result"]["doubled"] == 42
    assert row["result"]["thread"].startswith("sundial-handler")
    [span] = [s for s in spans.get_finished_spans() if s.name == "blocking"]  # the handler span, current in its thread
    assert row["result"]["trace_id"] == format(span.context.trace_id, "032x")


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


async def test_no_more_executions_are_claimed_than_can_run(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str
) -> None:
    active = 0
    most_active = 0
    claim_to_start: list[float] = []
    worker = Worker(pool=pool)
    # A message claimed without a free slot would sit claimed for a whole run of an earlier handler; a run long
    # beside the claim-to-start of a loaded machine keeps the two apart.
    run_sec = 0.6

    @worker.handler("slow")
    async def slow(ctx: Context, payload: Any) -> None:
        nonlocal active, most_active
        active += 1
        most_active = max(most_active, active)
        # How long ago this execution was claimed (PENDING → RUNNING): a message taken from Kafka
        # without a free slot would sit claimed while the earlier handlers run.
        claim_to_start.append(
            await stores.database.pool.fetchval(
                "SELECT extract(epoch FROM clock_timestamp() - started_at)::float8 FROM executions WHERE id = $1",
                ctx.execution_id,
            )
        )
        await asyncio.sleep(run_sec)
        active -= 1

    async with serving(worker, settings, concurrency=2):
        messages = await dispatch(stores, pool, "slow", [{}] * 6)
        await publish(publisher, messages)
        for m in messages:
            await wait_state(stores, m, "SUCCEEDED")
    assert most_active == 2
    assert len(claim_to_start) == 6
    assert max(claim_to_start) < run_sec * 0.8, claim_to_start


async def test_graceful_stop_waits_for_the_running_handler(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str
) -> None:
    started = asyncio.Event()
    worker = Worker(pool=pool)

    @worker.handler("slow")
    async def slow(ctx: Context, payload: Any) -> str:
        started.set()
        await asyncio.sleep(1.0)
        return "done"

    async with serving(worker, settings) as runtime:
        [message] = await dispatch(stores, pool, "slow", [{}])
        await publish(publisher, [message])
        await asyncio.wait_for(started.wait(), 20)
        assert (await execution(stores, message))["state"] == "RUNNING"
        await runtime.stop()
        # stop() returned: the handler finished and its outcome is in Postgres.
        row = await execution(stores, message)
        assert (row["state"], row["result"]) == ("SUCCEEDED", "done")
        assert runtime.stats.abandoned == 0


async def test_finished_messages_are_not_delivered_again_to_the_group(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str, kafka_bootstrap: str
) -> None:
    async with serving(demo_worker(pool), settings):
        messages = await dispatch(stores, pool, "echo", [{"i": i} for i in range(8)])
        await publish(publisher, messages)
        for m in messages:
            await wait_state(stores, m, "SUCCEEDED")
    # After the stop (final commit, group left), a new member reads from the committed offsets: put a
    # sentinel at the end of every partition and read until all four have come back.
    sentinels = await dispatch(stores, pool, "echo", [{"sentinel": p} for p in range(4)])
    for partition, sentinel in enumerate(sentinels):
        await asyncio.to_thread(produce_to, kafka_bootstrap, partition, [sentinel])
    sentinel_ids = {s.execution_id for s in sentinels}

    def all_sentinels(seen: list[tuple[int, int, ExecutionMessage]]) -> bool:
        return sentinel_ids <= {m.execution_id for _, _, m in seen}

    seen = await asyncio.to_thread(read_as_group, kafka_bootstrap, pool, all_sentinels, JOIN_SEC + 10)
    assert {m.execution_id for _, _, m in seen} == sentinel_ids


async def test_offset_is_never_committed_past_a_message_whose_handler_runs(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str, kafka_bootstrap: str
) -> None:
    worker = demo_worker(pool)

    @worker.handler("hang")
    async def hang(ctx: Context, payload: Any) -> None:
        await asyncio.sleep(3600)

    runtime = WorkerRuntime(worker, settings, config=dataclasses.replace(FAST, shutdown_grace_sec=0.2))
    await runtime.start()
    try:
        await asyncio.wait_for(runtime.ready.wait(), JOIN_SEC)
        [blocked] = await dispatch(stores, pool, "hang", [{}])
        behind = await dispatch(stores, pool, "echo", [{"i": 1}, {"i": 2}])
        # Partition 0 holds: the hanging execution at offset 0, then two that finish at offsets 1 and 2.
        await asyncio.to_thread(produce_to, kafka_bootstrap, 0, [blocked, *behind])
        for m in behind:
            await wait_state(stores, m, "SUCCEEDED")
        await wait_state(stores, blocked, "RUNNING")
        # Proof that the committer runs: a message finished on partition 1 gets committed.
        [other] = await dispatch(stores, pool, "echo", [{"i": 3}])
        await asyncio.to_thread(produce_to, kafka_bootstrap, 1, [other])
        await wait_state(stores, other, "SUCCEEDED")

        async def partition_1_committed() -> bool:
            return (await asyncio.to_thread(committed, kafka_bootstrap, pool, [1]))[1] == 1

        await wait_until(partition_1_committed, "partition 1's offset to be committed")
        assert (await asyncio.to_thread(committed, kafka_bootstrap, pool, [0]))[0] == OFFSET_INVALID
    finally:
        await runtime.stop()  # the grace runs out: the hanging handler is abandoned, not marked
    assert runtime.stats.abandoned == 1
    assert (await execution(stores, blocked))["state"] == "RUNNING"  # left for the sweeper
    assert (await asyncio.to_thread(committed, kafka_bootstrap, pool, [0]))[0] == OFFSET_INVALID

    def partition_0_replayed(seen: list[tuple[int, int, ExecutionMessage]]) -> bool:
        return len([1 for p, _, _ in seen if p == 0]) >= 3

    seen = await asyncio.to_thread(read_as_group, kafka_bootstrap, pool, partition_0_replayed, JOIN_SEC + 10)
    replayed = [(offset, m.execution_id) for p, offset, m in seen if p == 0]
    assert replayed == [(0, blocked.execution_id), (1, behind[0].execution_id), (2, behind[1].execution_id)]
    assert other.execution_id not in {m.execution_id for _, _, m in seen}


async def test_a_marker_is_acknowledged_and_runs_nothing(
    stores: Stores, settings: WorkerSettings, pool: str, kafka_bootstrap: str
) -> None:
    async with serving(demo_worker(pool), settings) as runtime:
        [after] = await dispatch(stores, pool, "echo", [{"i": 1}])
        # Partition 0 holds: the sweeper's marker (a message with no value) at offset 0, then an execution at 1.
        await asyncio.to_thread(produce_marker, kafka_bootstrap, pool, 0)
        await asyncio.to_thread(produce_to, kafka_bootstrap, 0, [after])
        await wait_state(stores, after, "SUCCEEDED")

        async def both_committed() -> bool:
            return (await asyncio.to_thread(committed, kafka_bootstrap, pool, [0]))[0] == 2

        await wait_until(both_committed, "partition 0's offset to be committed past both")
    assert runtime.stats.consumed == 2
    assert (runtime.stats.started, runtime.stats.duplicates, runtime.stats.undecodable) == (1, 0, 0)


def produce_marker(bootstrap: str, pool: str, partition: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    producer.produce(pool_topic(pool), value=None, partition=partition)
    assert producer.flush(10) == 0


async def test_handler_span_continues_the_dispatch_trace(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str, spans: InMemorySpanExporter
) -> None:
    with tracer.start_as_current_span("dispatch", kind=SpanKind.PRODUCER) as dispatch_span:
        carrier = traceparent()
    assert carrier is not None
    worker = Worker(pool=pool)

    outgoing: dict[str, str] = {}

    @worker.handler("traced")
    async def traced(ctx: Context, payload: Any) -> str | None:
        # The handler's own work, as docs/operations/observability.md shows it: a span of its own and an outgoing call.
        with tracer.start_as_current_span("charge card"):
            propagate.inject(outgoing)
        return ctx.trace_id

    async with serving(worker, settings):
        [message] = await dispatch(stores, pool, "traced", [{}], traceparent_value=carrier)
        await publish(publisher, [message])
        row = await wait_state(stores, message, "SUCCEEDED")
    mine = [
        s
        for s in spans.get_finished_spans()
        if s.attributes and s.attributes.get("sundial.execution_id") == message.execution_id
    ]
    [process] = [s for s in mine if s.name == f"process {message.topic}"]
    [handler] = [s for s in mine if s.name == "traced"]
    [write] = [s for s in mine if s.name == "record outcome"]
    assert process.kind == SpanKind.CONSUMER
    assert process.parent is not None
    assert process.parent.span_id == dispatch_span.get_span_context().span_id
    assert {s.context.trace_id for s in mine} == {dispatch_span.get_span_context().trace_id}
    assert process.attributes is not None
    assert process.attributes["messaging.system"] == "kafka"
    assert process.attributes["messaging.destination.name"] == message.topic
    assert process.attributes["messaging.kafka.message.key"] == message.execution_id
    assert process.attributes["sundial.attempt"] == 1 and process.attributes["sundial.tenant"] == TENANT
    assert process.attributes["sundial.outcome"] == "SUCCEEDED"
    # The handler span is the process span's child, and the outcome write hangs under the process span too.
    assert handler.parent is not None and handler.parent.span_id == process.context.span_id
    assert handler.attributes is not None and handler.attributes["sundial.handler"] == "traced"
    assert write.parent is not None and write.parent.span_id == process.context.span_id
    [own] = [s for s in spans.get_finished_spans() if s.name == "charge card"]
    assert own.parent is not None and own.parent.span_id == handler.context.span_id
    assert outgoing["traceparent"].split("-")[1:3] == [row["trace_id"], format(own.context.span_id, "016x")]
    assert row["result"] == trace_id_hex(dispatch_span) == row["trace_id"]


async def test_without_an_exporter_no_span_is_built_and_the_handler_still_runs_in_the_dispatch_trace(
    stores: Stores,
    publisher: KafkaPublisher,
    settings: WorkerSettings,
    pool: str,
    spans: InMemorySpanExporter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What a worker without SUNDIAL_OTLP_ENDPOINT does (ALWAYS_OFF: nothing could be recorded), here under the test
    # session's recording provider.
    monkeypatch.setattr("sundial_worker.execution.spans_recorded", lambda: False)
    with tracer.start_as_current_span("dispatch", kind=SpanKind.PRODUCER) as dispatch_span:
        carrier = traceparent()
    assert carrier is not None
    worker = Worker(pool=pool)
    outgoing: dict[str, str] = {}

    @worker.handler("traced")
    async def traced(ctx: Context, payload: Any) -> str | None:
        propagate.inject(outgoing)  # an instrumented outgoing call
        return ctx.trace_id

    async with serving(worker, settings):
        [message] = await dispatch(stores, pool, "traced", [{}], traceparent_value=carrier)
        await publish(publisher, [message])
        row = await wait_state(stores, message, "SUCCEEDED")
    assert not [
        s
        for s in spans.get_finished_spans()
        if s.attributes and s.attributes.get("sundial.execution_id") == message.execution_id
    ]
    assert row["result"] == trace_id_hex(dispatch_span) == row["trace_id"]
    # The call carries the execution's trace, unsampled, as the ALWAYS_OFF tracer's span did.
    assert outgoing["traceparent"].split("-")[1] == row["trace_id"]
    assert int(outgoing["traceparent"][-2:], 16) & 0x01 == 0  # the sampled flag is clear


@dataclasses.dataclass
class WorkerProcess:
    """A real `python -m sundial_worker` process and the lines of its log so far."""

    process: asyncio.subprocess.Process
    lines: list[str]

    @property
    def log(self) -> str:
        return "\n".join(self.lines)


@asynccontextmanager
async def worker_process(
    tmp_path: Path, pool: str, settings_env: dict[str, str], worker_id: str
) -> AsyncIterator[WorkerProcess]:
    """`python -m sundial_worker --app tenant_app:worker` — an app module in the working directory, as a tenant
    would have it, with the demo `sleep` handler in ``pool`` — once it has joined its group; killed at exit if
    the test left it running, and its log read to the end."""
    (tmp_path / "tenant_app.py").write_text(
        textwrap.dedent(
            f"""
            from sundial_worker import Worker
            from sundial_worker.demo import sleep

            worker = Worker(pool={pool!r})
            worker.handler("sleep")(sleep)
            """
        )
    )
    env = {**os.environ, **settings_env, "SUNDIAL_WORKER_ID": worker_id, "SUNDIAL_WORKER_SHUTDOWN_GRACE_SEC": "20"}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sundial_worker",
        "--app",
        "tenant_app:worker",
        cwd=tmp_path,
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    worker = WorkerProcess(process, [])
    assigned = asyncio.Event()

    async def read_log() -> None:
        assert process.stderr is not None
        async for raw in process.stderr:
            worker.lines.append(raw.decode(errors="replace").rstrip())
            if "partitions assigned" in worker.lines[-1]:
                assigned.set()

    reader = asyncio.create_task(read_log())
    try:
        await asyncio.wait_for(assigned.wait(), JOIN_SEC)
        yield worker
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await asyncio.wait_for(reader, 10)


async def test_cli_runs_an_app_and_finishes_the_running_handler_on_sigterm(
    stores: Stores, publisher: KafkaPublisher, settings_env: dict[str, str], pool: str, tmp_path: Path
) -> None:
    async with worker_process(tmp_path, pool, settings_env, "cli-worker") as worker:
        [message] = await dispatch(stores, pool, "sleep", [{"seconds": 1.5}])
        await publish(publisher, [message])
        await wait_state(stores, message, "RUNNING")
        worker.process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(worker.process.wait(), 30)
    log = worker.log
    assert code == 0, log
    row = await execution(stores, message)
    assert (row["state"], row["result"], row["worker_id"]) == ("SUCCEEDED", {"slept": 1.5}, "cli-worker"), log
    [attempt] = await opened_all(stores, await stores.executions.execution_attempts(row["id"]))
    assert attempt["progress"] == {"slept": 1.5}
    assert "worker cli-worker stopped" in log
