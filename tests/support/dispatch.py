"""The dispatch path in the integration tests: due jobs written as the API writes them, the hot window, and a
read of what reached a pool's topic.

The ``pool`` fixture gives each test a pool of its own (topics outlive a test in the session's broker);
:func:`consume` reads a topic from its start on assigned partitions, with no consumer group to join.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from redis.asyncio import Redis
from sundial_common.broker.messages import ExecutionMessage
from sundial_common.domain.ids import new_id
from sundial_common.hotwindow.window import HotWindow
from sundial_common.stores import Stores

from tests.support.messages import header


def ms_precision(instant: datetime) -> datetime:
    """Fire times are stored at millisecond precision, as the API writes them."""
    return instant.replace(microsecond=instant.microsecond // 1000 * 1000)


@pytest.fixture
async def hot_window(redis_url: str) -> AsyncIterator[HotWindow]:
    redis = Redis.from_url(redis_url)
    yield HotWindow(redis)
    await redis.aclose()


@pytest.fixture
def pool() -> str:
    # Topics outlive a test in the session's broker; a pool of its own keeps each test's messages apart.
    return f"t-{uuid.uuid4().hex[:10]}"


async def make_job(
    stores: Stores, due: datetime, pool: str, *, traceparent_value: str | None = None, shard: int = 0
) -> uuid.UUID:
    job_id = new_id()
    await stores.jobs.insert_job(
        {
            "id": job_id,
            "tenant_id": "acme",
            "name": "test",
            "type": "ONE_SHOT",
            "run_at": ms_precision(due),
            "pool": pool,
            "handler": "echo",
            "payload": {"n": str(job_id)},
            "timeout_sec": 30,
            "shard": shard,
            "next_fire_at": ms_precision(due),
            "traceparent": traceparent_value,
        },
        actor="test",
    )
    return job_id


def consume(bootstrap: str, topic: str, count: int, timeout: float = 15.0) -> list[ExecutionMessage]:
    """Read ``count`` messages from the start of ``topic`` (assigned partitions: no group join wait)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex}"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        messages: list[ExecutionMessage] = []
        deadline = datetime.now(UTC) + timedelta(seconds=timeout)
        while len(messages) < count and datetime.now(UTC) < deadline:
            for raw in consumer.consume(num_messages=count, timeout=0.5):
                value = raw.value()
                if raw.error() is None and value is not None:  # not the sweeper's markers (no value)
                    decoded = ExecutionMessage.decode(value)
                    assert header(raw, "execution_id").decode() == decoded.execution_id
                    assert int(header(raw, "fence_token")) == decoded.fence_token
                    assert header(raw, "tenant").decode() == decoded.tenant_id
                    messages.append(decoded)
        return messages
    finally:
        consumer.close()
