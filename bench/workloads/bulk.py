"""A bulk re-drive of 100,000 DEAD executions beside another tenant's stream: how long it takes, the rate it holds
and the other tenant's lateness meanwhile — and the same stream without the re-drive.

On a fresh stack per mode: tenant ``bench-api`` has ``--executions`` DEAD executions of the demo ``echo`` handler
(written straight into Postgres, their job one-shot and completed); tenant ``bench-b`` has a stream of one-shot
``echo`` jobs due at ``--stream-rate`` a second for as long as the re-drive should take at ``--rate``. In mode
``redrive`` the re-drive is asked for through the API (``POST /v1/bulk-operations``) as the stream starts, and run
by the bulk runner (:class:`sundial_replayer.bulk.BulkRunner`, the replayer's, here in the bench process at the
replayer's defaults); the re-driven attempts then go through the dispatcher and the workers like any retry. In
mode ``alone`` the stream runs by itself. Each prints and appends to ``bench/results/bulk.jsonl``:

* **redrive_s**, **rate_per_s** — the operation's start to end, and rows a second over it; **rate_windows** —
  the rows acted on in each 5-second window (how steadily the rate was held); **redriven_started** — of the
  re-driven executions, how many ran again by the end;
* **b_lateness_ms** — P50/P95/P99/max of the stream's handler start − due; **b_commit_ms** (its execution's
  commit − due: the dispatcher's part), **b_start_after_commit_ms** (start − commit: the topic's and the workers'
  part), **b_shard0_lateness_ms** and **b_shard0_commit_ms** (its jobs on the shard of the re-driven executions: a
  negative commit figure is a commit ahead of the due instant, with the publish lead).

    uv run --frozen python -m bench bulk --port-offset 600                         # 100,000; redrive,alone
    uv run --frozen python -m bench bulk --port-offset 600 --executions 20000 --modes redrive

A measurement, never a pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from redis.asyncio import Redis
from sundial_common.domain.ids import new_id
from sundial_common.hotwindow.window import HotWindow
from sundial_common.stores import Stores
from sundial_replayer.bulk import BulkConfig, BulkRunner

from bench import results
from bench.figures import percentiles
from bench.harness import Bench, Shape, ports_at, spread
from bench.registration import POOL
from bench.results import REPO, RESULTS

TENANT = "bench-api"
OTHER = "bench-b"


async def _dead_executions(conn: asyncpg.Connection, count: int) -> None:
    job = new_id()
    await conn.execute(
        "INSERT INTO jobs (id, tenant_id, name, type, pool, handler, timeout_sec, state, shard)"
        " VALUES ($1, $2, 'outage-victims', 'ONE_SHOT', $3, 'echo', 60, 'COMPLETED', 0)",
        job,
        TENANT,
        POOL,
    )
    now = datetime.now(UTC)
    for start in range(0, count, 10_000):
        ids = [new_id() for _ in range(min(10_000, count - start))]
        await conn.execute(
            "INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler, state,"
            " attempt, max_attempts, timeout_sec, error, finished_at)"
            " SELECT e.id, $1, $2, $3::timestamptz - (e.i + $5) * interval '1 millisecond', 0, 1, $6, 'echo', 'DEAD',"
            " 3, 3, 60, 'RuntimeError: downstream unavailable', $3"
            " FROM unnest($4::uuid[]) WITH ORDINALITY AS e (id, i)",
            TENANT,
            job,
            now,
            ids,
            start,
            POOL,
        )


async def run(bench: Bench, args: argparse.Namespace, redrive: bool) -> dict[str, Any]:
    conn = await asyncpg.connect(bench.stack.postgres_dsn)
    stores = await Stores.connect(bench.stack.postgres_dsn, max_size=4)
    try:
        await _dead_executions(conn, args.executions)
        duration = args.executions / args.rate
        due = spread(int(duration * args.stream_rate), duration, args.lead)
        await bench.insert_jobs(OTHER, due)
        await asyncio.sleep(max(0.0, (due[0] - datetime.now(UTC)).total_seconds()))
        figures: dict[str, Any] = {}
        if redrive:
            figures.update(await _redrive(bench, stores, conn, args))
        deadline = time.monotonic() + duration + 600
        while time.monotonic() < deadline:
            await asyncio.sleep(1.0)  # polling progress; there is no event to wait on
            left = await conn.fetchval(
                "SELECT count(*) FROM jobs WHERE tenant_id = $1 AND state = 'ACTIVE'", OTHER
            ) + await conn.fetchval("SELECT count(*) FROM executions WHERE tenant_id = $1 AND phase = 'OPEN'", OTHER)
            if left == 0 and datetime.now(UTC) > due[-1]:
                break
        rows = await conn.fetch(
            "SELECT e.scheduled_for, e.created_at, e.started_at, j.shard"
            " FROM executions e JOIN jobs j ON j.id = e.job_id WHERE e.tenant_id = $1 AND e.started_at IS NOT NULL",
            OTHER,
        )
        figures["b_jobs"] = len(due)
        figures["b_started"] = len(rows)
        figures["b_lateness_ms"] = percentiles(
            [(r["started_at"] - r["scheduled_for"]).total_seconds() * 1000 for r in rows]
        )
        # Where the lateness is: committed after the due instant (the dispatcher), or started after the commit
        # (the pool's topic and the workers); and the lateness of the jobs on the re-driven executions' shard (0).
        figures["b_commit_ms"] = percentiles(
            [(r["created_at"] - r["scheduled_for"]).total_seconds() * 1000 for r in rows]
        )
        figures["b_start_after_commit_ms"] = percentiles(
            [(r["started_at"] - r["created_at"]).total_seconds() * 1000 for r in rows]
        )
        shard0 = [r for r in rows if r["shard"] == 0]
        figures["b_shard0_lateness_ms"] = percentiles(
            [(r["started_at"] - r["scheduled_for"]).total_seconds() * 1000 for r in shard0]
        )
        figures["b_shard0_commit_ms"] = percentiles(
            [(r["created_at"] - r["scheduled_for"]).total_seconds() * 1000 for r in shard0]
        )
        if redrive:
            figures["redriven_started"] = await conn.fetchval(
                "SELECT count(*) FROM executions WHERE tenant_id = $1 AND attempt = 4", TENANT
            )
        return figures
    finally:
        await stores.close()
        await conn.close()


async def _redrive(bench: Bench, stores: Stores, conn: asyncpg.Connection, args: argparse.Namespace) -> dict[str, Any]:
    body = {"target": "executions", "action": "redrive", "filter": {"state": "DEAD", "pool": POOL}}
    base = f"http://127.0.0.1:{bench.ports.api}"
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {bench.token}"}, timeout=60) as api:
        created = (await api.post("/v1/bulk-operations", json={**body, "ratePerSec": args.rate})).json()
    op_id = created["operationId"]
    config = BulkConfig(tenant_rate_per_sec=max(args.rate, BulkConfig().tenant_rate_per_sec))
    redis = Redis.from_url(bench.stack.env()["SUNDIAL_REDIS_URL"])
    runner = BulkRunner(stores.bulk, config, HotWindow(redis))
    windows: list[int] = []
    window_start, window_done = time.monotonic(), 0
    while True:
        await runner.run_once()
        row = await conn.fetchrow("SELECT * FROM bulk_operations WHERE id = $1::uuid", op_id)
        if time.monotonic() - window_start >= 5.0:
            windows.append(row["done"] - window_done)
            window_start, window_done = time.monotonic(), row["done"]
        if row["state"] not in ("PREPARING", "RUNNING"):
            break
    await redis.aclose()
    took = (row["finished_at"] - row["started_at"]).total_seconds()
    return {
        "state": row["state"],
        "total": row["total"],
        "done": row["done"],
        "skipped": row["skipped"],
        "redrive_s": round(took, 1),
        "rate_per_s": round(row["done"] / took, 1) if took > 0 else None,
        "rate_windows_5s": windows,
        "prepare_s": round((row["started_at"] - row["created_at"]).total_seconds(), 2),
    }


async def main_async(args: argparse.Namespace) -> None:
    shape = Shape(args.shards, args.dispatchers, args.workers, args.concurrency, durable=False)
    ports = ports_at(args.port_offset)
    for mode in args.modes.split(","):
        redrive = {"redrive": True, "alone": False}[mode.strip()]
        bench = Bench(shape, args.root, ports)
        bench.start()
        try:
            figures = await run(bench, args, redrive)
        finally:
            bench.stop()
        settings = {
            **vars(shape),
            "mode": mode.strip(),
            "executions": args.executions,
            "rate": args.rate,
            "stream_rate": args.stream_rate,
        }
        results.record("bulk", figures, settings, results=args.results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench bulk", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--dispatchers", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=256, help="handler slots per worker")
    parser.add_argument("--executions", type=int, default=100_000, help="DEAD executions to re-drive")
    parser.add_argument("--rate", type=int, default=500, help="the operation's ratePerSec")
    parser.add_argument("--stream-rate", type=float, default=20.0, help="the other tenant's jobs due a second")
    parser.add_argument("--modes", default="redrive,alone", help="redrive, alone or both, run in this order")
    parser.add_argument("--lead", type=float, default=5.0, help="seconds between registration and the first due")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--root", type=Path, default=REPO / ".sundial" / "bench-bulk")
    parser.add_argument("--port-offset", type=int, default=0, help="ports = BENCH_PORTS + this (a multiple of 100)")
    asyncio.run(main_async(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
