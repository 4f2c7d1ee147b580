"""Census: what the dispatchers' fair-pass census (``open_executions``, sql/tenants.sql) costs Postgres under churn.

Every dispatcher process reads the open executions per tenant and pool every ``counts_refresh_sec`` (0.25 s).
The rows it counts are few (what waits in the topics and what runs), but every execution leaves index entries
of its dead PENDING and RUNNING versions in the partial indexes of the open states until vacuum, and a scan
that does not mark them dead visits all of them again at every call.

One Postgres (the bench's settings), one fresh database per mode, the same churn in each, round by round
(alternating which goes first): ``--open`` PENDING
executions waiting (a backlog in the topic), then rounds of ``--batch`` executions each inserted PENDING,
started the next round and finished the round after (as a dispatcher, a worker's start and its finish do, in
batches), with the census read after each round (at 2,500 executions/s and two dispatcher processes, ~300
executions between two reads). Modes:

- ``store``: the census as the dispatcher reads it (``TenantStore.open_executions``);
- ``bitmap``: the same statement without its planner settings (as before: the planner's bitmap scan).

Per mode: mean and median milliseconds of the census (wall, client side) and, from pg_stat_statements, its
mean execution milliseconds and shared buffers per call, over the last half of the rounds (when the churn has
left the most dead versions behind).

    uv run --frozen python -m bench census --port-offset 300
    uv run --frozen python -m bench census --port-offset 300 --executions 200000 --open 5000

A measurement, never a pass/fail. Appends one JSON line to ``bench/results/<workload>.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import asyncpg
from sundial_common.domain.ids import new_id
from sundial_common.stores import Stores
from sundial_common.stores.tenants import Q as TENANT_QUERIES
from sundial_infra.servers.postgres import PostgresServer
from sundial_infra.stack import BENCH_PORTS

from bench import results
from bench.harness import POSTGRES_SETTINGS, fresh_database
from bench.results import REPO, RESULTS

TENANTS = ("bench-a", "bench-b")
CENSUS = "-- The dispatcher's fair pass (read by each dispatcher process%"
INSERT = (
    "INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler, state,"
    " timeout_sec) SELECT id, $2, $3, now() + make_interval(secs => $4 + n), 0, 1, 'bench', 'echo', 'PENDING', 60"
    " FROM unnest($1::uuid[]) WITH ORDINALITY AS u (id, n)"
)
START = "UPDATE executions SET state = 'RUNNING', worker_id = 'w', started_at = now() WHERE id = ANY($1::uuid[])"
FINISH = "UPDATE executions SET state = 'SUCCEEDED', finished_at = now() WHERE id = ANY($1::uuid[])"


async def prepare(server: PostgresServer, name: str) -> str:
    dsn = await fresh_database(server, name)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.executemany("INSERT INTO tenants (id) VALUES ($1)", [(t,) for t in TENANTS])
    finally:
        await conn.close()
    return dsn


class Mode:
    """One database going through the churn, its census read one way."""

    def __init__(self, name: str, stores: Stores) -> None:
        self.name = name
        self.stores = stores
        self.pool = stores.database.pool
        self.jobs = [new_id() for _ in TENANTS]
        self.inserted: list[list[Any]] = []
        self.wall: list[float] = []

    async def setup(self, waiting: int) -> None:
        for tenant, job in zip(TENANTS, self.jobs, strict=True):
            await self.pool.execute(
                "INSERT INTO jobs (id, tenant_id, name, type, pool, handler, timeout_sec, state, shard)"
                " VALUES ($1, $2, 'j', 'ONE_SHOT', 'bench', 'echo', 60, 'COMPLETED', 0)",
                job,
                tenant,
            )
        for offset in range(0, waiting, 1000):
            ids = [new_id() for _ in range(min(1000, waiting - offset))]
            await self.pool.execute(INSERT, ids, TENANTS[0], self.jobs[0], -offset - 1000)

    async def round(self, r: int, batch: int) -> None:
        ids = [new_id() for _ in range(batch)]
        await self.pool.execute(INSERT, ids, TENANTS[r % 2], self.jobs[r % 2], r * batch)
        self.inserted.append(ids)
        if len(self.inserted) >= 2:
            await self.pool.execute(START, self.inserted[-2])
        if len(self.inserted) >= 3:
            await self.pool.execute(FINISH, self.inserted.pop(0))
        started = time.perf_counter()
        if self.name == "store":
            await self.stores.tenants.open_executions(30.0, 1.0)
        else:
            await self.pool.fetch(TENANT_QUERIES["open_executions"], 30.0, 1.0)
        self.wall.append((time.perf_counter() - started) * 1000)

    async def reset(self) -> None:
        await self.pool.execute("SELECT pg_stat_statements_reset()")
        self.wall.clear()

    async def result(self) -> dict[str, Any]:
        row = await self.pool.fetchrow(
            "SELECT sum(calls) AS calls, sum(total_exec_time) / sum(calls) AS mean_ms,"
            " sum(shared_blks_hit + shared_blks_read) / sum(calls) AS blocks FROM pg_stat_statements"
            " WHERE query LIKE $1 AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
            CENSUS,
        )
        return {
            "wall_ms": {
                "mean": round(statistics.fmean(self.wall), 2),
                "median": round(statistics.median(self.wall), 2),
            },
            "exec_ms": round(float(row["mean_ms"]), 2),
            "blocks_per_call": round(float(row["blocks"]), 1),
            "calls": int(row["calls"]),
        }


async def measure(server: PostgresServer, args: argparse.Namespace) -> dict[str, Any]:
    """Both databases through the same rounds, alternating which goes first (the machine's load falls on both)."""
    modes = [
        Mode(name, await Stores.connect(await prepare(server, f"census_{name}"), min_size=1, max_size=2))
        for name in args.modes
    ]
    try:
        for mode in modes:
            await mode.setup(args.open)
        rounds = args.executions // args.batch
        for r in range(rounds):
            if r == rounds // 2:
                for mode in modes:
                    await mode.reset()
            for mode in modes if r % 2 == 0 else reversed(modes):
                await mode.round(r, args.batch)
        return {mode.name: await mode.result() for mode in modes}
    finally:
        for mode in modes:
            await mode.stores.close()


async def main_async(args: argparse.Namespace) -> None:
    root = args.root.resolve()
    shutil.rmtree(root, ignore_errors=True)
    server = PostgresServer(root / "postgres", BENCH_PORTS.postgres + args.port_offset, settings=POSTGRES_SETTINGS)
    server.start()
    try:
        result = await measure(server, args)
    finally:
        server.stop()
    settings = {"executions": args.executions, "batch": args.batch, "open": args.open}
    results.record("census", result, settings, results=args.results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench census", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--executions", type=int, default=100_000, help="executions through the churn per mode")
    parser.add_argument("--batch", type=int, default=300, help="executions per round (between two census reads)")
    parser.add_argument("--open", type=int, default=2_000, help="PENDING executions waiting throughout")
    parser.add_argument("--modes", nargs="+", default=["bitmap", "store"], choices=["bitmap", "store"])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--root", type=Path, default=REPO / ".sundial" / "bench-census")
    parser.add_argument("--port-offset", type=int, default=0, help="ports = BENCH_PORTS + this (a multiple of 100)")
    asyncio.run(main_async(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
