"""A message published ahead of its due instant (``due_at``) on a real worker: held until then, outside the slots.

The dispatcher publishes up to ``SUNDIAL_DISPATCHER_PUBLISH_LEAD_MS`` ahead (tests/integration/test_publish_lead.py);
here the messages are made the same way (the real dispatch transaction, then a message with ``due_at``) and produced to
one partition, so the order they sit in and the offsets they commit are the test's. The due instants are seconds
ahead: far beyond what a loaded machine takes to deliver and start a message due at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka import OFFSET_INVALID
from sundial_common.broker.messages import ExecutionMessage
from sundial_common.stores import Stores
from sundial_worker import Context, Worker
from sundial_worker.settings import WorkerSettings

from tests.support.pools import admit
from tests.support.worker import (
    TENANT,
    committed,
    dispatch,
    execution,
    produce_to,
    serving,
    wait_state,
    wait_until,
)

HOLD = timedelta(seconds=5)


@pytest.fixture
def pool(database_url: str) -> str:
    return admit(database_url, f"w-{uuid.uuid4().hex[:10]}", TENANT)


@pytest.fixture
def settings(database_url: str, redis_url: str, kafka_bootstrap: str) -> WorkerSettings:
    return WorkerSettings(database_url=database_url, redis_url=redis_url, kafka_bootstrap=kafka_bootstrap)


def ahead(message: ExecutionMessage, by: timedelta) -> tuple[ExecutionMessage, datetime]:
    due = datetime.now(UTC) + by
    return dataclasses.replace(message, due_at=due.isoformat()), due


def recording_worker(name: str, calls: list[uuid.UUID], called_at: dict[uuid.UUID, datetime] | None = None) -> Worker:
    worker = Worker(pool=name)

    @worker.handler("record")
    async def record(ctx: Context, payload: Any) -> None:
        calls.append(ctx.execution_id)
        if called_at is not None:
            called_at[ctx.execution_id] = datetime.now(UTC)

    return worker


async def test_a_message_published_ahead_starts_at_its_due_instant_without_taking_the_slot_meanwhile(
    stores: Stores, settings: WorkerSettings, pool: str, kafka_bootstrap: str
) -> None:
    calls: list[uuid.UUID] = []
    called_at: dict[uuid.UUID, datetime] = {}
    async with serving(recording_worker(pool, calls, called_at), settings, concurrency=1) as runtime:
        early, now = await dispatch(stores, pool, "record", [{"n": 1}, {"n": 2}])
        early, due = ahead(early, HOLD)
        # Partition 0: the held message at offset 0, one due at once behind it at offset 1.
        await asyncio.to_thread(produce_to, kafka_bootstrap, 0, [early, now])

        await wait_state(stores, now, "SUCCEEDED")
        # The one slot ran the message due now while the other waited for its instant, taken but not acknowledged:
        # the partition's offset cannot move past it.
        assert (await execution(stores, early))["state"] == "PENDING"
        assert runtime.consumer.pending() >= 1  # type: ignore[attr-defined]
        assert (await asyncio.to_thread(committed, kafka_bootstrap, pool, [0]))[0] == OFFSET_INVALID

        started = await wait_state(stores, early, "SUCCEEDED")
        # Claimed just before its instant, called at it: not a moment before, and its started_at is when the
        # handler was launched, not the instant it was meant for.
        handler_called = called_at[uuid.UUID(early.execution_id)]
        assert due <= started["started_at"] <= handler_called < due + timedelta(seconds=1)

        async def both_committed() -> bool:
            return (await asyncio.to_thread(committed, kafka_bootstrap, pool, [0]))[0] == 2

        await wait_until(both_committed, "partition 0's offset to pass both messages")
    assert calls == [uuid.UUID(now.execution_id), uuid.UUID(early.execution_id)]


async def test_an_execution_cancelled_after_its_early_publish_never_starts(
    stores: Stores, settings: WorkerSettings, pool: str, kafka_bootstrap: str
) -> None:
    calls: list[uuid.UUID] = []
    async with serving(recording_worker(pool, calls), settings) as runtime:
        [message] = await dispatch(stores, pool, "record", [{}])
        message, _ = ahead(message, HOLD / 2)
        await asyncio.to_thread(produce_to, kafka_bootstrap, 0, [message])

        async def taken() -> bool:
            return runtime.stats.consumed == 1

        await wait_until(taken, "the worker to take (and hold) the message")
        cancelled = await stores.executions.cancel_execution(TENANT, uuid.UUID(message.execution_id), "test")
        assert cancelled is not None and cancelled["state"] == "CANCELLED"

        async def acknowledged() -> bool:  # at its due instant the start CAS loses, and the message is done
            return (await asyncio.to_thread(committed, kafka_bootstrap, pool, [0]))[0] == 1

        await wait_until(acknowledged, "the held message to be acknowledged at its due instant", within=30)
    row = await execution(stores, message)
    assert (row["state"], row["started_at"]) == ("CANCELLED", None)
    assert calls == []
    assert runtime.stats.started == 0


async def test_a_worker_stopped_while_holding_leaves_the_message_for_the_group(
    stores: Stores, settings: WorkerSettings, pool: str, kafka_bootstrap: str
) -> None:
    calls: list[uuid.UUID] = []
    [message] = await dispatch(stores, pool, "record", [{}])
    message, due = ahead(message, HOLD)
    async with serving(recording_worker(pool, calls), settings) as first:

        async def taken() -> bool:
            return first.stats.consumed == 1

        await asyncio.to_thread(produce_to, kafka_bootstrap, 0, [message])
        await wait_until(taken, "the first worker to take (and hold) the message")
    # Stopped before the due instant: nothing started, nothing committed.
    assert (await execution(stores, message))["state"] == "PENDING"
    assert (await asyncio.to_thread(committed, kafka_bootstrap, pool, [0]))[0] == OFFSET_INVALID

    async with serving(recording_worker(pool, calls), settings):
        started = await wait_state(stores, message, "SUCCEEDED", within=30)
    assert started["started_at"] >= due
    assert calls == [uuid.UUID(message.execution_id)]
