"""A replay survives kill -9 of its replayer: a standby takes over and resumes where the progress stands.

Real ``sundial replayer`` processes (elected in etcd like the sweeper) on the session's broker and Postgres.
The replay is rate-limited so that the kill lands mid-way; the staging topic is read back afterwards to
check that every message of the window arrived (at least once) and to count the duplicates the kill cost
(the batch in flight, published but not committed).
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from confluent_kafka import Consumer, TopicPartition
from sundial_common.broker.kafka import ensure_topics
from sundial_common.broker.messages import pool_topic
from sundial_common.stores import Stores
from sundial_common.stores.replays import NewReplay

from tests.integration.test_replays import PARTITIONS, history, produce
from tests.support.messages import header
from tests.support.processes import Processes

pytestmark = pytest.mark.e2e

COUNT = 6000
RATE = 1500


async def _row(db: asyncpg.Connection, replay_id: uuid.UUID) -> asyncpg.Record:
    row = await db.fetchrow("SELECT * FROM replays WHERE id = $1", replay_id)
    assert row is not None
    return row


def _staged(bootstrap: str, topic: str, at_least: int) -> list[str]:
    """The replay-execution-id header of every message in the staging topic."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4().hex}"})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(4)])
        ids: list[str] = []
        deadline = time.monotonic() + 30
        idle = 0
        while time.monotonic() < deadline and (len(ids) < at_least or idle < 2):
            batch = [m for m in consumer.consume(5000, 0.5) if m.error() is None]
            idle = 0 if batch else idle + 1
            for m in batch:
                ids.append(header(m, "sundial-replay-execution-id").decode())
        return ids
    finally:
        consumer.close()


async def test_kill_9_of_the_replayer_mid_replay_resumes_and_completes(
    processes: Processes, stores: Stores, database_url: str, kafka_bootstrap: str
) -> None:
    pool = f"ledger-{uuid.uuid4().hex[:8]}"
    now = datetime.now(UTC)
    ensure_topics(kafka_bootstrap, [pool_topic(pool)], partitions=PARTITIONS)
    sent = history(pool, now, COUNT, step=0.01, start=90)
    produce(kafka_bootstrap, sent)
    replay, _ = await stores.replays.insert_replay(
        NewReplay(
            tenant_id="ops",
            created_by="test",
            source_pool=pool,
            target_pool=f"staging-{pool}",
            window_from=now - timedelta(minutes=5),
            window_to=now,
            rate_per_sec=RATE,
        )
    )
    env = {"SUNDIAL_LEASE_TTL_SEC": "2", "SUNDIAL_LEASE_MARGIN_SEC": "0.5", "SUNDIAL_REPLAYER_BATCH_SIZE": "500"}
    db = await asyncpg.connect(database_url)
    try:
        processes.start("replayer-1", "replayer", env={**env, "SUNDIAL_INSTANCE_ID": "replayer-1"})
        deadline = time.monotonic() + 60
        while (await _row(db, replay["id"]))["published"] < COUNT // 5:
            assert time.monotonic() < deadline, processes.log("replayer-1")[-3000:]
            await asyncio.sleep(0.05)
        processes.stop("replayer-1", signal.SIGKILL)
        at_kill = await _row(db, replay["id"])
        assert at_kill["state"] == "RUNNING" and at_kill["published"] < COUNT

        processes.start("replayer-2", "replayer", env={**env, "SUNDIAL_INSTANCE_ID": "replayer-2"})
        deadline = time.monotonic() + 60
        while (done := await _row(db, replay["id"]))["state"] == "RUNNING":
            assert time.monotonic() < deadline, processes.log("replayer-2")[-3000:]
            await asyncio.sleep(0.1)
    finally:
        await db.close()
    assert done["state"] == "SUCCEEDED", done["error"]
    assert done["resumes"] == 1
    # Counters and offsets are committed together, so they count each message once however often it was sent.
    assert done["matched"] == done["published"] == COUNT
    staged = _staged(kafka_bootstrap, pool_topic(f"staging-{pool}"), COUNT)
    assert set(staged) == {s.message.execution_id for s in sent}  # every message arrived
    duplicates = len(staged) - COUNT
    print(f"kill -9 at {at_kill['published']}/{COUNT} published: {duplicates} duplicates in staging")
    assert 0 <= duplicates <= 500 * PARTITIONS  # at most the batch in flight at the kill
