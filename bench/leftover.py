"""Where the executions a dispatch run left unfinished were, read before the stack stops.

A run that ends with executions not done (the harness's settle ran out) says only how many. This says where each
one was, so that a loss can be told apart from a slow recovery:

- **never published**: PENDING with no ``published_at`` (the dispatcher's mark is a second late, so a message may
  still be out: the topic scan below says);
- **published, not in the topic**: its execution id is not in any message of the pool's topic (the broker
  acknowledged it and dropped it, or it was never produced);
- **in the topic, behind the group's committed offset**: the broker has it, and the consumer group has moved past
  it without a start (a worker took it and let go of it, or the commit passed it);
- **in the topic, ahead of the committed offset**: not consumed yet, or consumed and held by a worker;
- RUNNING (a worker holds it);
- ended without succeeding (the run counts only SUCCEEDED as done): FAILED_WORKER_LOST, TIMED_OUT, FAILED, DEAD —
  whether a retry is scheduled, and the error, say which and why.

The topic is read from its start by a consumer of a group of its own (nothing is committed), and only when
something was left: a W3 run's topic holds its ~100,000 messages (a few seconds to read). The consumer group's
committed offsets are read through the same client (``committed`` of the workers' group, which does not join it).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from typing import Any

import asyncpg
from confluent_kafka import Consumer, KafkaError, TopicPartition
from sundial_common.broker.messages import pool_topic

#: The run's executions not SUCCEEDED, with what tells where each one is.
_NOT_DONE = """
SELECT id::text AS id, state, attempt, published_at IS NOT NULL AS published, started_at IS NOT NULL AS started,
       worker_id, scheduled_for, published_at, created_at, started_at, finished_at, next_attempt_at,
       left(error, 160) AS error,
       (SELECT count(*) FROM execution_attempts a WHERE a.execution_id = e.id) AS attempts
FROM executions e WHERE tenant_id = $1 AND phase <> 'SUCCEEDED'"""


def _topic_scan(bootstrap: str, topic: str, group: str, wanted: set[str]) -> dict[str, Any]:
    """Per partition: the high watermark and the group's committed offset; for each wanted execution id, the
    (partition, offset) of every message of it in the topic."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-leftover-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
    )
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        highs = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
        # The workers' group's commits, read without joining it (a Consumer of another group may ask for them).
        peek = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
        try:
            committed = {
                tp.partition: tp.offset
                for tp in peek.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
            }
        finally:
            peek.close()
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        found: dict[str, list[tuple[int, int]]] = {}
        ended: set[int] = {p for p in partitions if highs[p] == 0}
        deadline = time.monotonic() + 120
        while len(ended) < len(partitions) and time.monotonic() < deadline:
            for message in consumer.consume(10_000, 1.0):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        ended.add(message.partition() or 0)
                    continue
                raw = message.headers() or []
                for name, value in raw.items() if isinstance(raw, dict) else raw:
                    if name == "execution_id" and value is not None:
                        key = value.decode() if isinstance(value, bytes) else value
                        if key in wanted:
                            found.setdefault(key, []).append((message.partition() or 0, message.offset() or 0))
                        break
        return {"high": highs, "committed": committed, "found": found, "read_all": len(ended) == len(partitions)}
    finally:
        consumer.close()


async def describe(conn: asyncpg.Connection, tenant: str, bootstrap: str, pool: str, group: str) -> dict[str, Any]:
    """Where the tenant's executions not SUCCEEDED are (counts by place), with the topic's and the group's offsets."""
    rows = await conn.fetch(_NOT_DONE, tenant)
    not_fired = await conn.fetchval("SELECT count(*) FROM jobs WHERE tenant_id = $1 AND state = 'ACTIVE'", tenant)
    topic = pool_topic(pool)
    scan = _topic_scan(bootstrap, topic, group, {r["id"] for r in rows if r["state"] == "PENDING"})
    places: Counter[str] = Counter()
    examples: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["state"] != "PENDING":
            retry = ", retry scheduled" if r["next_attempt_at"] is not None else ""
            place = f"{r['state']}{' (started)' if r['started'] else ''}{retry}"
        elif r["id"] not in scan["found"]:
            place = "PENDING, not in the topic" + ("" if r["published"] else " (never marked published)")
        elif any(offset < scan["committed"].get(p, -1) for p, offset in scan["found"][r["id"]]):
            place = "PENDING, in the topic behind the group's committed offset"
        else:
            place = "PENDING, in the topic at or after the group's committed offset"
        places[place] += 1
        examples.setdefault(
            place,
            {
                "id": r["id"],
                "attempt": r["attempt"],
                "scheduled_for": r["scheduled_for"].isoformat(),
                "created_at": r["created_at"].isoformat(),
                "published_at": r["published_at"].isoformat() if r["published_at"] else None,
                "worker_id": r["worker_id"],
                "started_at": r["started_at"].isoformat() if r["started_at"] else None,
                "finished_at": r["finished_at"].isoformat() if r["finished_at"] else None,
                "next_attempt_at": r["next_attempt_at"].isoformat() if r["next_attempt_at"] else None,
                "attempt_rows": r["attempts"],
                "error": r["error"],
                "messages": scan["found"].get(r["id"], []),
            },
        )
    return {
        "jobs_not_fired": not_fired,
        "not_succeeded": dict(places),
        "examples": examples,
        "topic": {
            str(p): {"high": scan["high"][p], "committed": scan["committed"].get(p)} for p in sorted(scan["high"])
        },
        "topic_read_to_end": scan["read_all"],
    }
