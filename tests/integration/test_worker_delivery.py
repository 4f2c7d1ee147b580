"""How the worker consumes its topic on the real broker: a duplicate, stale or repeated delivery runs nothing
again, and the group's committed offset never passes a message whose handler has not finished.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

import pytest
from confluent_kafka import OFFSET_INVALID, Producer
from sundial_common.broker.kafka import KafkaPublisher
from sundial_common.broker.messages import ExecutionMessage, pool_topic
from sundial_common.stores import Stores
from sundial_common.stores.executions import PostgresExecutionStore
from sundial_common.stores.types import Record
from sundial_worker import Context, Worker, WorkerRuntime
from sundial_worker.settings import WorkerSettings

from tests.support.worker import (
    FAST,
    JOIN_SEC,
    committed,
    demo_worker,
    dispatch,
    execution,
    pool,
    produce_to,
    publish,
    read_as_group,
    serving,
    settings,
    wait_state,
    wait_until,
)

__all__ = ["pool", "settings"]  # the fixtures


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
