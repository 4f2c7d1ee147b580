"""Replay throughput: messages a second the replayer scans and re-publishes into a staging pool.

    uv run python -m bench replay                       # 200,000 messages, ports BENCH_PORTS + 40
    uv run python -m bench replay --messages 500000 --port-offset 700

It starts its own stack (Postgres and the broker, under ``.sundial/bench-replay-<offset>/``), produces
``--messages`` execution messages into a pool topic of ``--partitions`` partitions with broker timestamps over
the last ten minutes, then runs three replays of the whole window with the real
:class:`~sundial_replayer.replayer.Replayer` (its production batch size, no rate limit), each timed from
RUNNING to SUCCEEDED by the replay's own ``startedAt``/``finishedAt``:

* **copy** — every message re-published (scanned = published);
* **filtered** — one handler of two (half re-published);
* **dry run** — scanned and counted only.

Beside them, ``raw_read_per_sec``: a bare consumer reading the same topic (the broker's part of the scan).

Results are printed and appended as one JSON line to ``bench/results/<workload>.jsonl`` with the machine. The
target (≥ 20,000 messages/s) is for the reader: a benchmark never passes or fails on timing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from sundial_common.broker.kafka import ensure_topics
from sundial_common.broker.messages import ExecutionMessage, pool_topic
from sundial_common.broker.topic_windows import KafkaTopicInspector
from sundial_common.runtime.clock import to_ms
from sundial_common.stores import Stores
from sundial_common.stores.replays import NewReplay
from sundial_common.stores.schema import upgrade
from sundial_infra.stack import LocalStack
from sundial_replayer.kafka import KafkaReplayKafka
from sundial_replayer.replayer import Replayer, ReplayerConfig

from bench import results
from bench.harness import ports_at
from bench.results import REPO, RESULTS

POOL = "bench-replay"


def produce(bootstrap: str, count: int, now: datetime) -> float:
    """``count`` messages over the last ten minutes; returns the seconds producing took."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000})
    topic = pool_topic(POOL)
    job = str(uuid.uuid4())
    started = time.perf_counter()
    first = to_ms(now - timedelta(minutes=10))
    step = 600_000 / count
    for i in range(count):
        message = ExecutionMessage(
            execution_id=str(uuid.uuid4()),
            job_id=job,
            tenant_id="bench",
            pool=POOL,
            handler=("charge", "refund")[i % 2],
            attempt=1,
            fence_token=1,
            scheduled_for=now.isoformat(),
            timeout_sec=30,
            payload={"order": i, "amount": 1999, "currency": "EUR"},
            traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )
        while True:
            try:
                producer.produce(
                    topic,
                    message.encode(),
                    key=message.execution_id.encode(),
                    headers=message.headers(),
                    timestamp=first + int(i * step),
                )
                break
            except BufferError:
                producer.poll(0.1)
        if i % 10000 == 0:
            producer.poll(0)
    producer.flush(60)
    return time.perf_counter() - started


def raw_read(bootstrap: str, count: int, partitions: int) -> float:
    """Messages/s a bare consumer reads the same topic at (the broker's side of the replayer's scan)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}"})
    consumer.assign([TopicPartition(pool_topic(POOL), p, 0) for p in range(partitions)])
    read = 0
    started = time.perf_counter()
    while read < count and time.perf_counter() - started < 300:
        first = consumer.consume(1, 1.0)
        read += sum(1 for m in first + consumer.consume(9999, 0) if m.error() is None)
    elapsed = time.perf_counter() - started
    consumer.close()
    return read / elapsed


async def replay(stores: Stores, replayer: Replayer, now: datetime, **filters: Any) -> dict[str, Any]:
    row, _ = await stores.replays.insert_replay(
        NewReplay(
            tenant_id="bench",
            created_by="bench",
            source_pool=POOL,
            target_pool=f"staging-{POOL}-{uuid.uuid4().hex[:6]}",
            window_from=now - timedelta(minutes=11),
            window_to=now,
            **filters,
        )
    )
    while True:
        await replayer.run_once()
        done = await stores.replays.get_replay(row["id"], None)
        assert done is not None
        if done["state"] not in ("PENDING", "RUNNING"):
            break
    seconds = (done["finished_at"] - done["started_at"]).total_seconds()
    return {
        "state": done["state"],
        "scanned": done["scanned"],
        "published": done["published"],
        "seconds": round(seconds, 3),
        "scanned_per_sec": round(done["scanned"] / seconds),
        "published_per_sec": round(done["published"] / seconds),
    }


async def run(args: argparse.Namespace, stack: LocalStack) -> dict[str, Any]:
    dsn = stack.postgres_dsn
    await upgrade(dsn)
    now = datetime.now(UTC)
    ensure_topics(stack.kafka_bootstrap, [pool_topic(POOL)], partitions=args.partitions)
    produce_sec = produce(stack.kafka_bootstrap, args.messages, now)
    print(f"produced {args.messages} messages in {produce_sec:.1f}s", flush=True)
    raw = raw_read(stack.kafka_bootstrap, args.messages, args.partitions)
    print(f"a bare consumer reads them at {raw:,.0f} messages/s", flush=True)
    stores = await Stores.connect(dsn)
    kafka = KafkaReplayKafka(stack.kafka_bootstrap, client_id="bench-replayer")
    topics = KafkaTopicInspector(stack.kafka_bootstrap)
    replayer = Replayer(stores, kafka, topics, ReplayerConfig(slice_sec=30))
    try:
        replays = {}
        for name, filters in (("dry_run", {"dry_run": True}), ("filtered", {"filter_handler": "charge"}), ("copy", {})):
            replays[name] = await replay(stores, replayer, now, **filters)
            print(name, json.dumps(replays[name]), flush=True)
    finally:
        await topics.close()
        await kafka.close()
        await stores.close()
    return {"produce_sec": round(produce_sec, 2), "raw_read_per_sec": round(raw), **replays}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000, help="messages in the window (default 200,000)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the source topic (default 4)")
    parser.add_argument("--port-offset", type=int, default=40, help="ports = BENCH_PORTS + this (default 40)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="directory of the <workload>.jsonl files")
    args = parser.parse_args(argv)
    root = REPO / ".sundial" / f"bench-replay-{args.port_offset}"
    stack = LocalStack(root, ports_at(args.port_offset), durable=False)
    stack.stop()  # leftovers of an interrupted run
    shutil.rmtree(root, ignore_errors=True)
    print(f"starting the stack under {root} …", flush=True)
    stack.start()
    try:
        line = asyncio.run(run(args, stack))
    finally:
        stack.stop()
    settings = {"messages": args.messages, "partitions": args.partitions, "batch_size": ReplayerConfig().batch_size}
    results.record("replay", line, settings, results=args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
