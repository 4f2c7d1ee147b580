"""A pool whose topic has fewer partitions than members, on the real broker: the member left with nothing must be
given the partition when its owner leaves.

The test broker fails this when the owner leaves while a newcomer's first join is still under way: its group
coordinator then answers no join of that group any more (the newcomer, a brand-new member or the same one
re-joining all wait; over 150 s measured), so the newcomer never owns the partition. A worker cannot repair a
group the coordinator stopped serving, so the case is kept here as an expected failure (it reports XPASS once the
broker is fixed); until then a rollout must wait for the new worker to own a partition before it stops
the old one (tests/e2e/test_rolling_upgrade.py does).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from sundial_worker.consumer import KafkaExecutionConsumer

from tests.support.messages import execution_message
from tests.support.worker import produce_to

#: A normal rebalance hands the partition over in ~5 s (session timeout + the rebalance); room for a loaded machine.
DEADLINE_SEC = 20.0


async def _pump(consumer: KafkaExecutionConsumer, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await consumer.poll(8, 0.2)


async def _owned(consumer: KafkaExecutionConsumer, what: str) -> None:
    started = time.monotonic()
    while not consumer.assigned():
        assert time.monotonic() - started < DEADLINE_SEC, what
        await asyncio.sleep(0.1)


async def _hand_over(kafka_bootstrap: str, *, wait_for_newcomer: bool) -> None:
    pool = f"rebalance-{uuid.uuid4().hex[:8]}"
    old = KafkaExecutionConsumer(kafka_bootstrap, pool, client_id="old", topic_partitions=1)
    new = KafkaExecutionConsumer(kafka_bootstrap, pool, client_id="new", topic_partitions=1)
    stop_old, stop_new = asyncio.Event(), asyncio.Event()
    await old.open()
    pumps = [asyncio.create_task(_pump(old, stop_old))]
    try:
        await _owned(old, "the only member got no partition")
        await new.open()
        pumps.append(asyncio.create_task(_pump(new, stop_new)))
        if wait_for_newcomer:
            await asyncio.wait_for(new.ready.wait(), DEADLINE_SEC)
            assert new.assigned() == set(), "the newcomer of a one-partition pool starts with nothing"
        stop_old.set()
        await pumps[0]
        await old.close()
        await asyncio.to_thread(produce_to, kafka_bootstrap, 0, [execution_message(pool)])
        await _owned(new, "the partition the old member left stayed unowned")
    finally:
        stop_old.set()
        stop_new.set()
        await asyncio.gather(*pumps, return_exceptions=True)
        await new.close()
        await old.close()


async def test_the_owner_leaving_after_a_newcomer_joined_hands_it_the_partition(kafka_bootstrap: str) -> None:
    await _hand_over(kafka_bootstrap, wait_for_newcomer=True)


# Not strict: the broker stalls only when the leave lands inside the held join, which a run after another test
# sometimes misses (alone, it stalled in every run here).
@pytest.mark.xfail(
    raises=AssertionError,
    reason="the broker's group coordinator stops answering joins after a leave during a join",
)
async def test_the_owner_leaving_during_a_newcomers_join_hands_it_the_partition(kafka_bootstrap: str) -> None:
    await _hand_over(kafka_bootstrap, wait_for_newcomer=False)
