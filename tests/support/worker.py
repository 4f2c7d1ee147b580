"""The worker runtime in the integration tests: work produced the way the dispatcher produces it, a runtime to
serve it, and the waits and broker reads its tests share.

:func:`dispatch` makes a job row and the fenced dispatch transaction's PENDING execution, :func:`publish` puts its
``ExecutionMessage`` on the pool's topic, :func:`serving` runs a :class:`WorkerRuntime` once it owns its partitions
and :func:`worker_process` a real ``python -m sundial_worker``. The ``pool`` fixture gives each test a pool (so a
topic and a consumer group) of its own, because topics outlive a test in the session's broker. Every wait is a
condition polled against a deadline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from redis.asyncio import Redis
from sundial_common.broker.kafka import Publisher
from sundial_common.broker.messages import ExecutionMessage, pool_topic
from sundial_common.domain.ids import new_id
from sundial_common.runtime.clock import from_ms, to_ms
from sundial_common.stores import Stores
from sundial_common.stores.dispatch import PlannedExecution
from sundial_common.stores.types import Occurrence, Record
from sundial_worker import Worker, WorkerConfig, WorkerRuntime
from sundial_worker import demo as demo_app
from sundial_worker.consumer import consumer_group
from sundial_worker.settings import WorkerSettings

from tests.support.pools import admit
from tests.support.sealed import opened

TENANT = "acme"
FAST = WorkerConfig(
    concurrency=8,
    heartbeat_interval_sec=0.5,
    heartbeat_ttl_sec=5.0,
    commit_interval_sec=0.1,
    shutdown_grace_sec=10.0,
)
JOIN_SEC = 30.0  # a fresh consumer group on tansu needs ~half the session timeout to get partitions


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
    retry_policy: dict[str, Any] | None = None,
    name: str | None = None,
) -> list[ExecutionMessage]:
    """Jobs due now in shard 0 (named ``name``, else after their handler), one per payload, dispatched through the
    real fenced transaction (token 1): PENDING executions and their messages."""
    due = from_ms(to_ms(datetime.now(UTC)))  # fire times are compared at millisecond precision
    occurrences = []
    for payload in payloads:
        job_id = new_id()
        await stores.jobs.insert_job(
            {
                "id": job_id,
                "tenant_id": tenant,
                "name": name or f"{handler}-test",
                "type": "ONE_SHOT",
                "run_at": due,
                "pool": pool,
                "handler": handler,
                "payload": payload,
                "retry_policy": retry_policy or {},
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
