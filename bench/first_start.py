"""First start after idle: one ONE_SHOT job at a time on a stack doing nothing, each due 2 s after its create.

Nothing else runs, so every start pays the whole path from a sleeping dispatcher (woken by its own look at the
window, the job being beyond the wake-up horizon when created) and a parked worker (woken by the publisher's
announcement): due → claim → dispatch transaction → publish → fetch → start CAS. Prints one JSON line (appended to
``bench/results/latency/<date>.jsonl``): per job, ms after due of the transaction's start, the produce and the start.

    .venv/bin/python bench/first_start.py --port-offset 500
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import httpx

sys.path.insert(0, str(Path(__file__).parent))
import harness
import machine
from sundial_infra.stack import BENCH_PORTS, Ports


async def measure(bench: harness.Bench, jobs: int, gap_sec: float) -> dict[str, object]:
    await asyncio.sleep(8)  # past start-up: the workers have parked, the leaders sleep
    url = f"http://127.0.0.1:{bench.ports.api}"
    ids: list[str] = []
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {bench.token}"}) as client:
        for i in range(jobs):
            due = harness._ms(datetime.now(UTC) + timedelta(seconds=2))
            body = {
                "name": f"s{i}",
                "type": "ONE_SHOT",
                "runAt": due.isoformat(),
                "target": {"pool": "demo", "handler": "echo"},
            }
            response = await client.post("/v1/jobs", json=body)
            response.raise_for_status()
            ids.append(response.json()["jobId"])
            await asyncio.sleep(gap_sec)
        await asyncio.sleep(3)
    conn = await asyncpg.connect(bench.stack.postgres_dsn)
    try:
        rows = await conn.fetch(
            "SELECT scheduled_for, created_at, published_at, started_at FROM executions"
            " WHERE job_id = ANY($1::uuid[]) ORDER BY scheduled_for",
            ids,
        )
    finally:
        await conn.close()

    def after_due(column: str) -> list[float | None]:
        return [round((r[column] - r["scheduled_for"]).total_seconds() * 1000, 1) if r[column] else None for r in rows]

    return {
        "workload": "first_start",
        "created": "API single",
        "jobs": jobs,
        "started": len([r for r in rows if r["started_at"]]),
        "tx_began_after_due_ms": after_due("created_at"),
        "produced_after_due_ms": after_due("published_at"),
        "started_after_due_ms": after_due("started_at"),
        "load": os.getloadavg()[0],
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench/first_start.py", description=__doc__)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--gap", type=float, default=3.0, help="seconds between creates (workers park after 0.5 s)")
    parser.add_argument("--port-offset", type=int, default=0)
    parser.add_argument("--results", type=Path, default=harness.RESULTS / "latency")
    args = parser.parse_args()
    os.environ.setdefault("SUNDIAL_ENV", "dev")
    ports = Ports(**{k: v + args.port_offset for k, v in vars(BENCH_PORTS).items()})
    bench = harness.Bench(harness.Shape(8, 2, 2, 256, True), harness.REPO / ".sundial" / "first-start", ports)
    bench.start()
    try:
        line = asyncio.run(measure(bench, args.jobs, args.gap))
    finally:
        bench.stop()
    harness._record({**line, "machine": machine.describe(harness.REPO)}, results=args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
