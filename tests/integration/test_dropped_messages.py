"""Scan (p) of the sweeper: a message the broker acknowledged and dropped is sent again once the pool's consumer group
has passed where it would be (``sundial_sweeper.consumed``), not after the outbox scan's 60 s — also when nothing is
published after it (the sweeper's markers); one still waiting in the topic is not."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from sundial_common.broker.kafka import KafkaPublisher, ensure_topics
from sundial_common.broker.messages import ExecutionMessage, pool_group, pool_topic
from sundial_common.hotwindow.window import HotWindow
from sundial_common.stores import Stores
from sundial_common.testing import FakeClock
from sundial_sweeper.consumed import ConsumedHorizon
from sundial_sweeper.sweeper import Sweeper, SweeperConfig
from sundial_worker.settings import WorkerSettings

from tests.integration.test_broker_incarnation import three_published
from tests.support.dispatch import consume, hot_window, pool
from tests.support.pools import admit
from tests.support.worker import demo_worker, serving, settings

__all__ = ["hot_window", "pool", "settings"]  # fixtures

#: The outbox scan's own window stays 60 s: only scan (p) can send anything again within these tests.
CONFIG = SweeperConfig(clock_skew_sec=0)


class Drops:
    """A broker that acknowledges every message and keeps none."""

    async def publish(self, messages: Sequence[ExecutionMessage]) -> list[Exception | None]:
        return [None for _ in messages]

    async def close(self) -> None:
        return None


@pytest.fixture
def horizon(kafka_bootstrap: str, pool: str) -> Iterator[ConsumedHorizon]:
    ensure_topics(kafka_bootstrap, [pool_topic(pool)], partitions=4)
    consumed = ConsumedHorizon(kafka_bootstrap)
    yield consumed
    consumed.close()


def append_to_every_partition(bootstrap: str, pool: str) -> None:
    """Other executions' messages, one in each partition."""
    topic = pool_topic(pool)
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition in range(4):
        other = ExecutionMessage(
            str(uuid.uuid4()), str(uuid.uuid4()), "acme", pool, "echo", 1, 1, datetime.now(UTC).isoformat(), 30, {}
        )
        producer.produce(topic, other.encode(), partition=partition, headers=other.headers())
    assert producer.flush(10) == 0


def commit_everything(bootstrap: str, pool: str) -> None:
    """What the pool's workers do once every message is started: the group's offsets at each partition's end."""
    topic = pool_topic(pool)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": pool_group(pool), "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = [
            TopicPartition(topic, p, consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1])
            for p in partitions
        ]
        consumer.commit(offsets=ends, asynchronous=False)
    finally:
        consumer.close()


async def test_messages_the_broker_dropped_are_sent_again_once_the_group_has_passed_them(
    stores: Stores,
    hot_window: HotWindow,
    publisher: KafkaPublisher,
    pool: str,
    kafka_bootstrap: str,
    horizon: ConsumedHorizon,
) -> None:
    await three_published(stores, hot_window, Drops(), pool)  # PENDING, marked published, in no partition
    dropped = [r["id"] for r in await stores.dispatch.stale_pending(datetime.now(UTC), datetime.now(UTC), 10)]
    assert len(dropped) == 3
    sweeper = Sweeper(stores, publisher, CONFIG, consumed=horizon)
    assert (await sweeper.run_once()).republished_passed == 0, "nothing appended since: nothing to tell by"
    # The pool goes on: more messages in every partition, and its workers acknowledge them all.
    await asyncio.to_thread(append_to_every_partition, kafka_bootstrap, pool)
    await asyncio.to_thread(commit_everything, kafka_bootstrap, pool)

    result = await sweeper.run_once()

    assert result.republished_passed == 3, "the group went past what came after them, and none of the three started"
    messages = await asyncio.to_thread(consume, kafka_bootstrap, pool_topic(pool), 7)
    assert {str(i) for i in dropped} <= {m.execution_id for m in messages}, "the three are in the topic now"
    assert (await sweeper.run_once()).republished_passed == 0, "sent again just now: in the topic, not yet passed"


async def test_a_message_passed_again_without_a_start_is_sent_again_only_after_a_backoff(
    stores: Stores,
    hot_window: HotWindow,
    publisher: KafkaPublisher,
    pool: str,
    kafka_bootstrap: str,
    horizon: ConsumedHorizon,
) -> None:
    await three_published(stores, hot_window, Drops(), pool)
    clock = FakeClock(datetime.now(UTC))
    sweeper = Sweeper(stores, publisher, CONFIG, clock, consumed=horizon)
    await sweeper.run_once()
    await asyncio.to_thread(append_to_every_partition, kafka_bootstrap, pool)
    await asyncio.to_thread(commit_everything, kafka_bootstrap, pool)
    assert (await sweeper.run_once()).republished_passed == 3
    assert (await sweeper.run_once()).republished_passed == 0, "sent again just now: in the topic, not yet passed"
    # The group passes the three again without starting them (a worker that cannot decode them, say).
    await asyncio.to_thread(append_to_every_partition, kafka_bootstrap, pool)
    await asyncio.to_thread(commit_everything, kafka_bootstrap, pool)

    assert (await sweeper.run_once()).republished_passed == 0, "not at every pass: they wait a backoff"
    clock.advance(5.0)
    assert (await sweeper.run_once()).republished_passed == 3, "and are sent again once it has passed"


async def test_messages_waiting_in_the_topic_are_not_sent_again(
    stores: Stores,
    hot_window: HotWindow,
    publisher: KafkaPublisher,
    pool: str,
    kafka_bootstrap: str,
    horizon: ConsumedHorizon,
) -> None:
    await three_published(stores, hot_window, publisher, pool)  # in the topic; no worker has read them
    sweeper = Sweeper(stores, publisher, CONFIG, consumed=horizon)

    passes = [await sweeper.run_once() for _ in range(3)]

    assert [p.republished for p in passes] == [0, 0, 0], "a backlog is not a loss"
    messages = await asyncio.to_thread(consume, kafka_bootstrap, pool_topic(pool), 6, 3.0)
    assert len(messages) == 3, "each message once: the dispatch's"


async def test_a_bursts_dropped_last_messages_run_long_before_the_outbox_window(
    stores: Stores,
    hot_window: HotWindow,
    publisher: KafkaPublisher,
    pool: str,
    database_url: str,
    settings: WorkerSettings,
    horizon: ConsumedHorizon,
) -> None:
    admit(database_url, pool, "acme")
    async with serving(demo_worker(pool), settings):
        # The last three of a burst, acknowledged and dropped: nothing is published after them, no later batch.
        await three_published(stores, hot_window, Drops(), pool)
        dropped = [r["id"] for r in await stores.dispatch.stale_pending(datetime.now(UTC), datetime.now(UTC), 10)]
        sweeper = Sweeper(stores, publisher, CONFIG, consumed=horizon)
        # Well inside the outbox scan's 60 s window (CONFIG keeps it), however slow this machine is today.
        deadline = time.monotonic() + 40
        states: list[str] = []
        while time.monotonic() < deadline:
            await sweeper.run_once()
            states = [await state(stores, i) for i in dropped]
            if states == ["SUCCEEDED"] * 3:
                break
            await asyncio.sleep(1.0)  # the sweeper's passes are 2 s apart; the worker's commits 0.1 s here

    assert states == ["SUCCEEDED"] * 3, "the sweeper's markers bound them: sent again and run, not a minute later"


async def state(stores: Stores, execution_id: uuid.UUID) -> str:
    row = await stores.executions.get_execution("acme", execution_id)
    assert row is not None
    return str(row["state"])
