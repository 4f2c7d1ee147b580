"""The dispatchers' publisher against the broker alone: produce requests per published batch and broker (Tansu) CPU
per message, for batches of a few sizes.

librdkafka sends one produce request per partition, and Tansu's cost follows its requests and stored batches,
so how a batch's messages are spread over a topic's partitions is
what this measures: the real :class:`~sundial_common.broker.kafka.KafkaPublisher` of this checkout, warmed as a
dispatcher warms it, publishing ``--batches`` batches of each size to a 4-partition topic on a broker of its own
(memory storage, nothing else connected), one batch at a time with a 10 ms pause. Requests are librdkafka's own
count (``statistics.interval.ms``); the broker's CPU is read from ``/proc``. Run it on two checkouts for a
before/after::

    uv run --frozen python -m bench publish-requests [--port-offset 300 | --port P] [--sizes 2,30] [--batches 300]

Prints one JSON line per size (appended to ``bench/results/publish-requests.jsonl``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sundial_common.broker.kafka import KafkaPublisher, ensure_topics
from sundial_common.broker.messages import ExecutionMessage, pool_topic
from sundial_common.domain.ids import new_id
from sundial_infra.servers.broker import BrokerServer
from sundial_infra.stack import BENCH_PORTS

from bench import machine, results


def _cpu_seconds(pid: int) -> float:
    return machine.cpu_ticks(pid) / os.sysconf("SC_CLK_TCK")


def _message(pool: str) -> ExecutionMessage:
    return ExecutionMessage(
        str(new_id()), str(new_id()), "acme", pool, "echo", 1, 1, datetime.now(UTC).isoformat(), 0, {"n": 1}
    )


async def measure(bootstrap: str, broker_pid: int, size: int, batches: int) -> dict[str, Any]:
    pool = f"publish-{new_id().hex[:8]}"
    topic = pool_topic(pool)
    ensure_topics(bootstrap, [topic], partitions=4, retention_ms=600_000)
    stats: list[str] = []
    reported = threading.Event()

    def on_stats(report: str) -> None:
        stats.append(report)
        reported.set()

    publisher = KafkaPublisher(bootstrap, **{"statistics.interval.ms": 100, "stats_cb": on_stats})
    try:
        publisher.warm([topic])

        async def produce_requests() -> int:
            # A report made after now: the publisher's poll thread serves the callback at least once a second.
            for _ in range(2):
                reported.clear()
                await asyncio.to_thread(reported.wait, 5)
            report = json.loads(stats[-1])
            return sum(int(broker["req"].get("Produce", 0)) for broker in report["brokers"].values())

        requests, cpu = await produce_requests(), _cpu_seconds(broker_pid)
        for _ in range(batches):
            errors = await publisher.publish([_message(pool) for _ in range(size)])
            assert not any(errors), errors
            await asyncio.sleep(0.01)
        cpu = _cpu_seconds(broker_pid) - cpu
        requests = await produce_requests() - requests
    finally:
        await publisher.close()
    return {
        "produce_requests_per_batch": round(requests / batches, 2),
        "broker_cpu_ms_per_message": round(cpu * 1000 / (batches * size), 4),
    }


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="sundial-publish-") as root:
        broker = BrokerServer(Path(root) / "broker", args.port or BENCH_PORTS.broker + args.port_offset)
        broker.start()
        try:
            assert broker.pid is not None
            for size in (int(size) for size in args.sizes.split(",")):
                line = await measure(broker.bootstrap, broker.pid, size, args.batches)
                settings = {"batch": size, "batches": args.batches}
                results.record("publish-requests", line, settings, results=args.results)
        finally:
            broker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench publish-requests",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port-offset", type=int, default=0, help="the broker's port = the bench broker's + this")
    parser.add_argument("--port", type=int, help="the broker's port (instead of the bench broker's + the offset)")
    parser.add_argument("--sizes", default="2,30", help="messages per published batch (W2 ~2, W3 ~30)")
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--results", type=Path, default=results.RESULTS, help="directory of the <workload>.jsonl files")
    asyncio.run(main_async(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
