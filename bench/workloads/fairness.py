"""Tenant fairness under a stampede: tenant A's N one-shot jobs and tenant B's M, all due at one instant.

A's jobs are registered first, so by due time and id B's are the very last in the hot window: without
fairness B waits for A's whole burst (in the dispatcher and then in the pool's Kafka topic). The same run is
made on a fresh stack with ``SUNDIAL_DISPATCHER_FAIRNESS`` on and with it off (``--modes``), and each prints
(and appends to ``bench/results/<workload>.jsonl``) B's P50/P95/max lateness (handler start − due), the share of
B's jobs started within 1 s of due, and A's drain time (last A start − due). A measurement, never a pass/fail.

    uv run --frozen python -m bench fairness --port-offset 900              # 100,000 + 1,000, on then off
    uv run --frozen python -m bench fairness --port-offset 900 --scale 0.1  # 10,000 + 100
    uv run --frozen python -m bench fairness --port-offset 900 --a 50000 --b 100 --modes on  # fairness on only
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from bench import results
from bench.figures import percentiles
from bench.harness import Bench, Shape, ports_at
from bench.results import REPO, RESULTS


async def run(bench: Bench, a: int, b: int, lead: float) -> dict[str, Any]:
    # Registered before they are due (COPY runs at a few thousand rows/s on a loaded 2-core machine), so
    # lateness is the dispatch's alone; the margin left is recorded.
    due = (datetime.now(UTC) + timedelta(seconds=lead + (a + b) / 4_000)).replace(microsecond=0)
    await bench.insert_jobs("tenant-a", [due] * a)
    await bench.insert_jobs("tenant-b", [due] * b)
    registered_before_due_s = round((due - datetime.now(UTC)).total_seconds(), 2)
    conn = await asyncpg.connect(bench.stack.postgres_dsn)
    try:
        await asyncio.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()))
        deadline, done = time.monotonic() + 600, 0
        while done < a + b and time.monotonic() < deadline:
            await asyncio.sleep(1.0)  # polling progress; there is no event to wait on
            done = await conn.fetchval("SELECT count(*) FROM executions WHERE started_at IS NOT NULL")
        rows = await conn.fetch(
            "SELECT tenant_id, created_at, started_at FROM executions WHERE started_at IS NOT NULL ORDER BY started_at"
        )
    finally:
        await conn.close()
    late: dict[str, list[float]] = {"a": [], "b": []}
    # When the dispatcher wrote B's executions: the part of B's lateness spent before the broker and workers.
    b_dispatched = [(r["created_at"] - due).total_seconds() * 1000 for r in rows if r["tenant_id"][-1] == "b"]
    for r in rows:
        late[r["tenant_id"][-1]].append((r["started_at"] - due).total_seconds() * 1000)
    return {
        "started": len(rows),
        "registered_before_due_s": registered_before_due_s,
        "b_lateness_ms": percentiles(late["b"]),
        "b_dispatched_ms": percentiles(b_dispatched),
        "b_within_1s": round(sum(1 for ms in late["b"] if ms <= 1000) / b, 3) if b else None,
        "a_drain_s": round(max(late["a"]) / 1000, 2) if late["a"] else None,
        "a_lateness_ms": percentiles(late["a"]),
    }


async def main_async(args: argparse.Namespace) -> None:
    shape = Shape(args.shards, args.dispatchers, args.workers, args.concurrency, durable=False)
    ports = ports_at(args.port_offset)
    a = args.a if args.a is not None else int(100_000 * args.scale)
    b = args.b if args.b is not None else int(1_000 * args.scale)
    for mode in args.modes.split(","):
        fairness = {"on": "true", "off": "false"}[mode.strip()]
        os.environ["SUNDIAL_DISPATCHER_FAIRNESS"] = fairness  # the supervised processes inherit it
        bench = Bench(shape, args.root, ports)
        bench.start()
        try:
            result = await run(bench, a, b, args.lead)
        finally:
            bench.stop()
        settings = {**vars(shape), "fairness": fairness == "true", "a_jobs": a, "b_jobs": b}
        results.record("fairness", result, settings, results=args.results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench fairness", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--dispatchers", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=256, help="handler slots per worker")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the counts (100,000 + 1,000)")
    parser.add_argument("--a", type=int, help="tenant A's jobs (default 100,000 x scale)")
    parser.add_argument("--b", type=int, help="tenant B's jobs (default 1,000 x scale)")
    parser.add_argument("--modes", default="on,off", help="fairness on, off or both (on,off), run in this order")
    parser.add_argument("--lead", type=float, default=5.0, help="seconds between registration and due")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--root", type=Path, default=REPO / ".sundial" / "bench-fairness")
    parser.add_argument("--port-offset", type=int, default=0, help="ports = BENCH_PORTS + this (a multiple of 100)")
    asyncio.run(main_async(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
