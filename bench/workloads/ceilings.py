"""Raw ceilings of this machine's parts, measured in the same run as Sundial's figures.

Each Sundial number reads as a fraction of what its parts allow: Postgres batched inserts of
execution-sized rows, Redis ZADD and the hot window's own claim script, broker produce and consume.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from redis.asyncio import Redis
from sundial_common.hotwindow.window import HotWindow
from sundial_common.stores.types import Occurrence


async def postgres_insert(dsn: str, rows: int, batch: int = 5000) -> dict[str, Any]:
    """Rows/s of ``INSERT … SELECT FROM unnest(…)`` batches into an executions-shaped table."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            """CREATE UNLOGGED TABLE IF NOT EXISTS bench_ceiling (
                 id uuid PRIMARY KEY, tenant_id text, job_id uuid, scheduled_for timestamptz, state text,
                 pool text, handler text, created_at timestamptz DEFAULT now())"""
        )
        await conn.execute("TRUNCATE bench_ceiling")
        now = datetime.now(UTC)
        started = time.perf_counter()
        for offset in range(0, rows, batch):
            n = min(batch, rows - offset)
            await conn.execute(
                """INSERT INTO bench_ceiling (id, tenant_id, job_id, scheduled_for, state, pool, handler)
                   SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::timestamptz[], $5::text[],
                                        $6::text[], $7::text[])""",
                [uuid.uuid4() for _ in range(n)],
                ["bench"] * n,
                [uuid.uuid4() for _ in range(n)],
                [now + timedelta(milliseconds=i) for i in range(n)],
                ["PENDING"] * n,
                ["bench"] * n,
                ["echo"] * n,
            )
        elapsed = time.perf_counter() - started
        await conn.execute("DROP TABLE bench_ceiling")
    finally:
        await conn.close()
    return {"rows": rows, "batch": batch, "rows_per_s": round(rows / elapsed)}


async def redis_hot_window(url: str, members: int, batch: int = 1000) -> dict[str, Any]:
    """ZADD members/s (pipelined batches) and members/s through the real claim script."""
    redis = Redis.from_url(url)
    hot = HotWindow(redis, prefix="bench-ceiling")
    try:
        await redis.delete(hot.key(0))
        due = datetime.now(UTC) - timedelta(seconds=1)
        occurrences = [Occurrence(uuid.uuid4(), due) for _ in range(members)]
        started = time.perf_counter()
        async with redis.pipeline(transaction=False) as pipe:
            for offset in range(0, members, batch):
                pipe.zadd(hot.key(0), {f"j:{o.job_id}": 0 for o in occurrences[offset : offset + batch]})
            await pipe.execute()
        zadd_elapsed = time.perf_counter() - started
        started = time.perf_counter()
        claimed = 0
        while claimed < members:
            got = await hot.claim(0, datetime.now(UTC), batch)
            if not got:
                break
            claimed += len(got)
        claim_elapsed = time.perf_counter() - started
        await redis.delete(hot.key(0))
    finally:
        await redis.aclose()
    return {
        "members": members,
        "zadd_per_s": round(members / zadd_elapsed),
        "claim_per_s": round(claimed / claim_elapsed),
        "claim_batch": batch,
    }


def broker_produce_consume(bootstrap: str, messages: int, size: int = 400) -> dict[str, Any]:
    """Messages/s produced (acks=all, batched) and consumed (assigned partitions) on one topic."""
    topic = f"bench.ceiling.{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.num.messages": 10000})
    value = b"x" * size
    started = time.perf_counter()
    for i in range(messages):
        while True:
            try:
                producer.produce(topic, value, key=str(i).encode())
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush(60)
    produce_elapsed = time.perf_counter() - started

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}", "fetch.wait.max.ms": 10}
    )
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    received = 0
    started = time.perf_counter()
    deadline = started + 120
    while received < messages and time.perf_counter() < deadline:
        received += sum(1 for m in consumer.consume(num_messages=10000, timeout=0.5) if m.error() is None)
    consume_elapsed = time.perf_counter() - started
    consumer.close()
    return {
        "messages": messages,
        "bytes": size,
        "produce_per_s": round(messages / produce_elapsed),
        "consume_per_s": round(received / consume_elapsed),
        "consumed": received,
    }


async def measure_all(dsn: str, redis_url: str, bootstrap: str, scale: float) -> dict[str, Any]:
    return {
        "postgres_insert": await postgres_insert(dsn, int(100_000 * scale)),
        "redis": await redis_hot_window(redis_url, int(200_000 * scale)),
        "broker": await asyncio.to_thread(broker_produce_consume, bootstrap, int(100_000 * scale)),
    }
