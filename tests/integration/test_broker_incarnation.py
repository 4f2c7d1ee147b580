"""Noticing a broker that lost its data (``KafkaIncarnation``) and the sweeper's republish of everything PENDING."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from sundial_common.broker.kafka import KafkaIncarnation, KafkaPublisher, Publisher
from sundial_common.broker.messages import ExecutionMessage, pool_topic
from sundial_common.hotwindow.window import HotWindow
from sundial_common.stores import Stores
from sundial_common.stores.types import Occurrence
from sundial_dispatcher.dispatcher import DispatcherConfig, ShardDispatcher
from sundial_sweeper.broker_restart import BrokerRestartRepublisher
from sundial_sweeper.sweeper import Sweeper, SweeperConfig

from tests.support.dispatch import consume, hot_window, make_job, ms_precision, pool

__all__ = ["hot_window", "pool"]  # fixtures


def test_a_broker_without_the_marker_is_a_new_incarnation(kafka_bootstrap: str) -> None:
    topic = f"test-incarnation-{uuid.uuid4().hex[:8]}"
    incarnation = KafkaIncarnation(kafka_bootstrap, topic=topic)
    try:
        assert incarnation.lost_its_data() is True, "no marker: nothing shows an earlier incarnation"
        assert incarnation.lost_its_data() is False, "the marker written the first time is there"
        assert incarnation.lost_its_data() is False

        # What a broker restarted empty looks like: the marker topic is gone.
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        for future in admin.delete_topics([topic], operation_timeout=10).values():
            future.result(10)
        deadline = time.monotonic() + 10
        while topic in admin.list_topics(timeout=5).topics and time.monotonic() < deadline:
            time.sleep(0.1)  # deletion is asynchronous in Kafka; nothing to wait on but the listing

        assert incarnation.lost_its_data() is True
        assert incarnation.lost_its_data() is False, "a new marker was written, so the next restart is noticed too"
    finally:
        incarnation.close()


class Restarted:
    """A broker incarnation that reports one restart, then the same broker."""

    def __init__(self) -> None:
        self.answers = [True]

    def lost_its_data(self) -> bool | None:
        return self.answers.pop() if self.answers else False

    def close(self) -> None:
        return None


async def three_published(stores: Stores, hot_window: HotWindow, publisher: Publisher, pool: str) -> None:
    """Three due jobs dispatched: three PENDING executions whose messages are in the pool's topic."""
    due = datetime.now(UTC) - timedelta(milliseconds=10)
    jobs = [await make_job(stores, due, pool) for _ in range(3)]
    await hot_window.add(0, [Occurrence(j, ms_precision(due)) for j in jobs])
    config = DispatcherConfig(mark_published_after_sec=0)
    assert (await ShardDispatcher(0, 1, "d", stores.dispatch, hot_window, publisher, config).run_once()).published == 3


async def test_the_sweeper_republishes_every_pending_execution_when_the_broker_restarted_empty(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, pool: str, kafka_bootstrap: str
) -> None:
    await three_published(stores, hot_window, publisher, pool)
    # Published just now: the outbox scan (b) would wait unstarted_after_sec (60 s) before sending them again.
    restart = BrokerRestartRepublisher(stores.dispatch, publisher, Restarted(), batch_size=2)
    sweeper = Sweeper(stores, publisher, SweeperConfig(), broker_restart=restart)

    result = await sweeper.run_once()

    assert result.republished_after_broker_restart == 3, "every PENDING execution, in pages of 2"
    assert (await sweeper.run_once()).republished_after_broker_restart == 0, "the same broker: nothing more"
    messages = await asyncio.to_thread(consume, kafka_bootstrap, pool_topic(pool), 6)
    ids = [m.execution_id for m in messages]
    assert len(ids) == 6 and len(set(ids)) == 3, "each execution's message sent twice: dispatch, then republish"


class RefusesFirst:
    """A publisher in front of a broker just back: the first ``refused`` messages fail, later ones go through."""

    def __init__(self, publisher: KafkaPublisher, refused: int) -> None:
        self.publisher = publisher
        self.refused = refused

    async def publish(self, messages: Sequence[ExecutionMessage]) -> list[Exception | None]:
        refused, self.refused = messages[: self.refused], max(0, self.refused - len(messages))
        errors: list[Exception | None] = [KafkaException("not yet") for _ in refused]
        return errors + await self.publisher.publish(messages[len(refused) :])

    async def close(self) -> None:
        return None


async def test_a_republish_the_restarted_broker_refused_is_sent_again_at_the_next_pass(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, pool: str, kafka_bootstrap: str
) -> None:
    await three_published(stores, hot_window, publisher, pool)
    restart = BrokerRestartRepublisher(stores.dispatch, RefusesFirst(publisher, 2), Restarted(), batch_size=10)

    first = await restart.run_once()
    again = await restart.run_once()

    assert (first.restarted, first.republished, first.publish_failed) == (True, 1, 2)
    assert (again.republished, again.publish_failed) == (2, 0), "the two refused, not the one sent, and not 60 s later"
    assert (await restart.run_once()).republished == 0
    messages = await asyncio.to_thread(consume, kafka_bootstrap, pool_topic(pool), 6)
    assert sorted(Counter(m.execution_id for m in messages).values()) == [2, 2, 2], "dispatch, then one republish each"
