"""Wake-ups through Redis: a shard leader sleeping until its next member, and a pool's parked workers.

A writer announces a member due within the horizon on the hot window's channel; the dispatcher's listener rings that
shard's alarm. The claim tells the leader when the earliest member left is due. A publisher announces the topics
it wrote to, and a worker's subscription calls its wake-up.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis
from sundial_common.broker.wakeups import WakingPublisher
from sundial_common.domain.ids import new_id
from sundial_common.hotwindow.window import HotWindow
from sundial_common.stores.types import Occurrence
from sundial_dispatcher.wakes import WakeListener
from sundial_worker.wakeups import TopicWakes

from tests.support.messages import execution_message


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def _until(condition: Callable[[], bool]) -> None:
    # The code under test sets plain flags (no event to wait on): look every 10 ms, for at most 10 s.
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def test_the_claim_says_when_the_next_member_is_due(redis: Redis) -> None:
    window = HotWindow(redis)
    now = datetime.now(UTC).replace(microsecond=0)
    later = now + timedelta(seconds=30)
    await window.add(3, [Occurrence(new_id(), now), Occurrence(new_id(), later)])
    claimed = await window.claim_due(3, now, 100)
    assert len(claimed.jobs) == 1
    assert claimed.next_due == later
    assert (await window.claim_due(3, later, 100)).next_due is None


async def test_a_member_due_soon_wakes_the_sleeping_leader_of_its_shard_and_a_far_one_does_not(redis: Redis) -> None:
    listener = WakeListener(redis)
    alarm = listener.alarm(5)
    other = listener.alarm(6)
    stop = asyncio.Event()
    task = asyncio.create_task(listener.run(stop))
    try:
        await _until(lambda: listener.listening)
        alarm.awake()
        other.awake()
        alarm.plan(datetime.now(UTC).timestamp() * 1000 + 60_000)  # sleeping for a minute
        other.plan(datetime.now(UTC).timestamp() * 1000 + 60_000)
        window = HotWindow(redis)
        await window.add(5, [Occurrence(new_id(), datetime.now(UTC) + timedelta(hours=1))])
        await asyncio.sleep(0.5)
        assert not alarm.ring.is_set()  # beyond the horizon: the leader's own look finds it
        await window.add(5, [Occurrence(new_id(), datetime.now(UTC))])
        await asyncio.wait_for(alarm.ring.wait(), 10)
        assert not other.ring.is_set()
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_a_publisher_wakes_the_workers_of_the_topics_it_wrote_to(redis: Redis) -> None:
    class Accepting:
        async def publish(self, messages: object) -> list[Exception | None]:
            return [None for _ in messages]  # type: ignore[attr-defined]

        async def close(self) -> None:
            pass

    woken: list[str] = []
    stopping = asyncio.Event()
    wakes = TopicWakes(redis, "sundial.pool.wake-a", lambda: woken.append("a"))
    task = asyncio.create_task(wakes.run(stopping))
    try:
        await _until(lambda: wakes.listening)
        publisher = WakingPublisher(Accepting(), redis)
        await publisher.publish([execution_message("wake-b")])
        await asyncio.sleep(0.3)
        assert woken == []  # another pool's topic
        await publisher.publish([execution_message("wake-a")])
        await _until(lambda: woken == ["a"])
    finally:
        stopping.set()
        await asyncio.wait_for(task, 10)
