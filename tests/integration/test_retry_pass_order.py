"""A shard's pass that claimed first fires and scheduled retries together sends the first fires first.

A bulk re-drive puts thousands of retries on the shard of the executions it re-drives; another job due there
must not wait for their transaction and publish. The retries' own fenced pass comes after the first fires are
committed and sent; if it fails, only the retries go back to the hot window, and the next pass sends them.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis
from sundial_common.broker.kafka import KafkaPublisher, ensure_topics
from sundial_common.broker.messages import ExecutionMessage, pool_topic
from sundial_common.hotwindow.window import HotWindow, retry_member
from sundial_common.stores import Stores
from sundial_common.stores.types import Occurrence, RetryDue
from sundial_dispatcher.dispatcher import DispatcherConfig, ShardDispatcher

from tests.integration.test_reliability import NO_JITTER_RETRY, make_executions, pool, redis, row_of
from tests.support.dispatch import make_job, ms_precision

__all__ = ["pool", "redis"]  # the fixtures


class Recording:
    """The real publisher, noting which executions each batch carried, in the order they were published."""

    def __init__(self, publisher: KafkaPublisher) -> None:
        self.publisher = publisher
        self.batches: list[list[str]] = []

    async def publish(self, messages: Sequence[ExecutionMessage]) -> list[Exception | None]:
        self.batches.append([m.execution_id for m in messages])
        return await self.publisher.publish(messages)

    async def close(self) -> None:
        pass


async def test_a_pass_sends_its_first_fires_before_the_retries_claimed_with_them(
    stores: Stores,
    redis: Redis,
    publisher: KafkaPublisher,
    pool: str,
    kafka_bootstrap: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ensure_topics(kafka_bootstrap, [pool_topic(pool)])
    failed = [
        uuid.UUID(m.execution_id) for m in await make_executions(stores, pool, "echo", 2, retry_policy=NO_JITTER_RETRY)
    ]
    await stores.database.pool.execute(
        "UPDATE executions SET state = 'FAILED', worker_id = 'w', next_attempt_at = now() - interval '1 second'"
        " WHERE id = ANY($1)",
        failed,
    )
    window = HotWindow(redis)
    recording = Recording(publisher)
    leader = ShardDispatcher(0, 5, "leader-5", stores.dispatch, window, recording, DispatcherConfig(shards=1))

    async def claimed_together(retry: uuid.UUID) -> None:
        """A job due now and ``retry``'s member, in the window for one pass."""
        due = ms_precision(datetime.now(UTC) - timedelta(milliseconds=10))
        job = await make_job(stores, due, pool)
        await window.add(0, [Occurrence(job, due)])
        await window.add_retries(0, [RetryDue(retry, datetime.now(UTC))])

    await claimed_together(failed[0])
    result = await leader.run_once()
    assert (result.claimed, result.dispatched, result.retried) == (2, 1, 1)
    [first_fire] = await stores.database.pool.fetch(
        "SELECT id FROM executions WHERE id <> ALL($1) AND fence_token = 5", failed
    )
    assert recording.batches == [[str(first_fire["id"])], [str(failed[0])]]
    assert ((await row_of(stores, failed[0]))["state"], (await row_of(stores, failed[0]))["attempt"]) == ("PENDING", 2)

    # The retries' pass fails (Postgres gone mid-pass): the first fire is out, the retry waits in the window.
    async def down(*args: object) -> None:
        raise ConnectionError("postgres down")

    monkeypatch.setattr(stores.dispatch, "dispatch_retries", down)
    recording.batches.clear()
    await claimed_together(failed[1])
    with pytest.raises(ConnectionError):
        await leader.run_once()
    assert len(recording.batches) == 1 and str(failed[1]) not in recording.batches[0]
    assert (await row_of(stores, failed[1]))["state"] == "FAILED"
    assert await redis.zscore(window.key(0), retry_member(failed[1])) is not None

    monkeypatch.undo()
    assert (await leader.run_once()).retried == 1
    assert recording.batches[-1] == [str(failed[1])]
    assert (await row_of(stores, failed[1]))["attempt"] == 2
