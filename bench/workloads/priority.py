"""Priority in one shared pool: a tenant's HIGH jobs due while its LOW backlog drains.

Two workers (``--concurrency`` slots each) and ``--low`` LOW ``sleep`` jobs of ``--seconds`` each, all due at
one instant (the issue: 2,000 of 1 s on two 16-slot workers, about a minute of work), then ``--high`` HIGH
``echo`` jobs of the same tenant due evenly over the first ``--spread`` of the drain. Each mode runs on a
fresh stack: ``priority`` (LOW and HIGH as said) and ``normal`` (the same jobs, every one NORMAL: what the
HIGH ones get without priority). Prints and appends to ``bench/results/<workload>.jsonl`` the urgent jobs'
lateness (handler start − due; the issue's target: P95 <= 0.5 s, max <= 1 s), split into dispatch (execution
created − due) and queue (start − created), and when the backlog drained. A measurement, never a pass/fail.

    uv run --frozen python -m bench priority --port-offset 900                          # 2,000 + 50, both modes
    uv run --frozen python -m bench priority --port-offset 900 --low 100000 --high 1000 --seconds 0.05 --spread 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from bench import results
from bench.figures import percentiles
from bench.harness import Bench, Shape, ports_at
from bench.results import REPO, RESULTS


async def run(bench: Bench, args: argparse.Namespace, prioritised: bool) -> dict[str, Any]:
    drain_sec = args.low * args.seconds / (args.workers * args.concurrency)
    # A few runs of another tenant first: a dispatcher keeps a pool's queue short once it has seen the pool start
    # work (a pool with no worker yet keeps the fixed cap), as a pool in service has.
    # Two waves, so that the second one's pass reads the counts while the first one runs.
    warm = (datetime.now(UTC) + timedelta(seconds=1)).replace(microsecond=0)
    warmup = [warm + timedelta(seconds=i % 2) for i in range(8)]
    await bench.insert_jobs("bench-warmup", warmup, handler="sleep", payload={"seconds": 2})
    due = (datetime.now(UTC) + timedelta(seconds=args.lead + args.low / 4_000)).replace(microsecond=0)
    await bench.insert_jobs(
        "bench-prio", [due] * args.low, handler="sleep", payload={"seconds": args.seconds},
        priority="LOW" if prioritised else "NORMAL",
    )  # fmt: skip
    # Due over the first ``spread`` of the drain, from 2 s in (the backlog is published and queued by then).
    span = max(0.0, args.spread * drain_sec - 2.0)
    urgent = [
        due + timedelta(milliseconds=round(1000 * (2.0 + span * i / max(1, args.high - 1)))) for i in range(args.high)
    ]
    await bench.insert_jobs("bench-prio", urgent, priority="HIGH" if prioritised else "NORMAL")
    registered_before_due_s = round((due - datetime.now(UTC)).total_seconds(), 2)
    conn = await asyncpg.connect(bench.stack.postgres_dsn)
    try:
        deadline, done = time.monotonic() + 120 + 3 * drain_sec, 0
        while done < 8 + args.low + args.high and time.monotonic() < deadline:
            await asyncio.sleep(1.0)  # polling progress; there is no event to wait on
            done = await conn.fetchval("SELECT count(*) FROM executions WHERE started_at IS NOT NULL")
        states = await conn.fetch("SELECT handler, state, count(*) AS n FROM executions GROUP BY 1, 2")
        jobs = await conn.fetch("SELECT handler, state, count(*) AS n FROM jobs GROUP BY 1, 2")
        print({"executions": [dict(r) for r in states], "jobs": [dict(r) for r in jobs]}, flush=True)
        rows = await conn.fetch(
            "SELECT e.handler, e.priority, e.fire_at, e.created_at, e.started_at FROM executions e"
            " WHERE e.started_at IS NOT NULL AND e.tenant_id = 'bench-prio'"
        )
    finally:
        await conn.close()
    high = [r for r in rows if r["handler"] == "echo"]
    low = [r for r in rows if r["handler"] == "sleep"]

    def ms(rows: list[Any], start: str, end: str) -> list[float]:
        return [(r[end] - r[start]).total_seconds() * 1000 for r in rows]

    last_high = max((r["started_at"] for r in high), default=None)
    return {
        "started": len(rows),
        "registered_before_due_s": registered_before_due_s,
        "high_lateness_ms": percentiles(ms(high, "fire_at", "started_at")),
        "high_dispatch_ms": percentiles(ms(high, "fire_at", "created_at")),
        "high_queue_ms": percentiles(ms(high, "created_at", "started_at")),
        "high_dispatched_as": sorted({r["priority"] for r in high}),
        "low_started_after_last_high": sum(1 for r in low if last_high and r["started_at"] > last_high),
        "low_drain_s": round((max(r["started_at"] for r in low) - due).total_seconds(), 2) if low else None,
    }


async def main_async(args: argparse.Namespace) -> None:
    shape = Shape(args.shards, 1, args.workers, args.concurrency, durable=False)
    ports = ports_at(args.port_offset)
    for mode in args.modes.split(","):
        bench = Bench(shape, args.root, ports)
        bench.start()
        try:
            result = await run(bench, args, prioritised={"priority": True, "normal": False}[mode.strip()])
        finally:
            bench.stop()
        settings = {**vars(shape), "mode": mode.strip(), "low_jobs": args.low, "high_jobs": args.high}
        results.record("priority", result, {**settings, "seconds_each": args.seconds}, results=args.results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench priority", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16, help="handler slots per worker")
    parser.add_argument("--low", type=int, default=2000, help="LOW sleep jobs, all due at once")
    parser.add_argument("--high", type=int, default=50, help="HIGH echo jobs due during the drain")
    parser.add_argument("--seconds", type=float, default=1.0, help="how long each LOW job sleeps")
    parser.add_argument("--spread", type=float, default=0.8, help="HIGH jobs come due over this part of the drain")
    parser.add_argument("--modes", default="priority,normal", help="priority, normal or both, run in this order")
    parser.add_argument("--lead", type=float, default=5.0, help="seconds between registration and due")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--root", type=Path, default=REPO / ".sundial" / "bench-priority")
    parser.add_argument("--port-offset", type=int, default=0, help="ports = BENCH_PORTS + this (a multiple of 100)")
    asyncio.run(main_async(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
