"""Consumer churn: is every message of a pool's topic delivered while members join, leave and crash?

One member of a pool's consumer group (the worker's real :class:`KafkaExecutionConsumer`) runs throughout,
saturated about half the time (its 16 "handler slots" finish at random, so it alternates between ``poll`` and
``keepalive``, the pause/seek path); meanwhile ``--churn`` short-lived members join, consume for 1–5 s and leave —
gracefully, or as a crash would (their unfinished messages never acknowledged, so their offsets stay
uncommitted). A producer sends ``--messages`` messages over the run; a last member then drains what is left.
The run reports every offset no member was ever handed: a partition paused before its first fetch was seen to
stay unread for good (librdkafka 2.16), which in production leaves executions to the sweeper's 60 s window.

``--consumer path/to/consumer.py`` runs another version of the module (e.g. ``git show <rev>:services/worker/
sundial_worker/consumer.py``) to compare. It starts its own broker on ``BENCH_PORTS.broker + --port-offset``.
A benchmark measures and records; it never passes or fails.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from sundial_common.broker.kafka import ensure_topics
from sundial_common.broker.messages import pool_topic
from sundial_infra.servers.broker import BrokerServer
from sundial_infra.stack import BENCH_PORTS

PARTITIONS = 4
SLOTS = 16


def load_consumer_module(path: str | None) -> ModuleType:
    if path is None:
        import sundial_worker.consumer

        return sundial_worker.consumer
    spec = importlib.util.spec_from_file_location("churn_consumer", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["churn_consumer"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


async def member(
    consumers: ModuleType,
    name: str,
    bootstrap: str,
    pool: str,
    seen: dict[int, set[int]],
    stop: asyncio.Event,
    rnd: random.Random,
    lifetime: float | None = None,
) -> str:
    """Consume as one member until ``stop`` (or ``lifetime`` s); returns how it left."""
    consumer = consumers.KafkaExecutionConsumer(bootstrap, pool, client_id=name)
    await consumer.open()
    began = time.monotonic()
    held: list[Any] = []
    while not stop.is_set() and (lifetime is None or time.monotonic() - began < lifetime):
        rnd.shuffle(held)
        finished = rnd.randint(0, len(held))
        for delivery in held[:finished]:
            consumer.ack(delivery)
        held = held[finished:]
        free = SLOTS - len(held)
        if free <= 0:
            await consumer.keepalive(0)
            await asyncio.sleep(0.01)
        else:
            for delivery in await consumer.poll(free, 0.05):
                seen.setdefault(delivery.partition, set()).add(delivery.offset)
                held.append(delivery)
        if rnd.random() < 0.2:
            await consumer.commit()
        await asyncio.sleep(rnd.random() * 0.01)
    crashed = lifetime is not None and rnd.random() < 0.5
    if not crashed:
        for delivery in held:
            consumer.ack(delivery)
    await consumer.close()  # a crash's unfinished messages stay unacknowledged: their offsets uncommitted
    return "crashed" if crashed else "left"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    consumers = load_consumer_module(args.consumer)
    with tempfile.TemporaryDirectory(prefix="sundial-churn-") as root:
        broker = BrokerServer(Path(root) / "broker", BENCH_PORTS.broker + args.port_offset)
        broker.start()
        try:
            pool = f"churn-{int(time.time())}"
            topic = pool_topic(pool)
            ensure_topics(broker.bootstrap, [topic], partitions=PARTITIONS)
            seen: dict[int, set[int]] = {}
            stop = asyncio.Event()
            rnd = random.Random(args.seed)
            steady = asyncio.create_task(member(consumers, "steady", broker.bootstrap, pool, seen, stop, rnd))
            producer = Producer({"bootstrap.servers": broker.bootstrap})

            async def produce() -> None:
                for i in range(args.messages):
                    producer.produce(topic, b"{}", key=str(i).encode())
                    if i % 100 == 0:
                        producer.poll(0)
                        await asyncio.sleep(0.05)
                producer.flush(30)

            producing = asyncio.create_task(produce())
            churn = []
            for i in range(args.churn):
                await asyncio.sleep(2)
                lifetime = rnd.uniform(1, 5)
                churn.append(await member(consumers, f"m{i}", broker.bootstrap, pool, seen, stop, rnd, lifetime))
            await producing
            last = asyncio.create_task(member(consumers, "last", broker.bootstrap, pool, seen, stop, rnd))
            await asyncio.sleep(args.drain)
            stop.set()
            await asyncio.gather(steady, last)
            probe = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"probe-{pool}"})
            never: dict[int, int] = {}
            produced = 0
            for partition in range(PARTITIONS):
                low, high = probe.get_watermark_offsets(TopicPartition(topic, partition), timeout=5, cached=False)
                produced += high - low
                missing = set(range(low, high)) - seen.get(partition, set())
                if missing:
                    never[partition] = len(missing)
            probe.close()
            return {
                "workload": "consumer_churn",
                "consumer": args.consumer or "sundial_worker.consumer",
                "seed": args.seed,
                "members": churn,
                "produced": produced,
                "never_delivered": sum(never.values()),
                "never_delivered_by_partition": never,
            }
        finally:
            broker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench consumer-churn", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=6000)
    parser.add_argument("--churn", type=int, default=6, help="short-lived members, one every 2 s")
    parser.add_argument("--drain", type=float, default=15.0, help="seconds the last member gets to drain")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--consumer", help="another consumer.py to run instead of the installed one")
    parser.add_argument("--port-offset", type=int, default=30, help="ports = BENCH_PORTS + this")
    print(json.dumps(asyncio.run(run(parser.parse_args(argv)))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
