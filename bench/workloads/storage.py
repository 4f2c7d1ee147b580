"""Storage: what partitioning ``executions`` by day (migration 0018) costs the three writes every execution makes.

One Postgres (the bench's settings, pg_stat_statements), two databases side by side: ``flat`` at revision 0017
(one table) and ``partitioned`` at the head with ``--days`` daily partitions of each table (40: the default
30-day retention plus the week made ahead). Each is filled with ``--rows`` finished executions and their
attempts (the index depth a busy day has), analysed, then measured in ``--rounds`` rounds, alternating which
database goes first so the machine's drifting load falls on both: per round ``--batch`` due jobs are
dispatched through the dispatcher's fenced transaction (``lock_due_jobs``, which raises the fence, and
``insert_executions``, which advances the jobs), started (the worker's ``start_executions``) and finished
(``finish_attempts``), through the same store calls the services make. Per database: the median wall
milliseconds of each call, from pg_stat_statements the mean execution and planning milliseconds of the
insert (and the dispatch's ``lock_due_jobs``), start and finish statements, and per execution the CPU of the
database's backends (/proc) and the WAL its rounds wrote.

    uv run --frozen python -m bench storage --port-offset 900
    uv run --frozen python -m bench storage --port-offset 900 --rows 1000000 --rounds 60

``--flat 0019`` measures the audit log's partitions instead (migration 0020): ``flat`` is then 0019 (executions
already partitioned, ``audit_log`` one table) and the head has ``--audit-days`` daily partitions of ``audit_log``
(98: the default 90-day retention plus the week ahead); each filled execution has its three audit rows
(dispatch, start, finish) in both.

``--variant FILE`` measures a schema change before it is a migration: ``flat`` is then the head with FILE's SQL
applied after it is filled (a trigger dropped, an index dropped, a table's fillfactor: an upper bound of what a
piece costs, or a candidate), against the head itself; ``--flat`` is ignored.

``--flat 0022`` measures migration 0023 (no index names ``state``, so a start is a heap-only update): ``flat`` is
then 0022 (the same partitions, the indexes on ``state``); the line also has, per database, the updates of
``executions`` in the measured rounds and how many of them were heap-only (``pg_stat_user_tables``).

A measurement, never a pass/fail. Appends one JSON line to ``bench/results/<workload>.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from sundial_common.domain.ids import new_id
from sundial_common.runtime.clock import from_ms, to_ms
from sundial_common.stores import Stores
from sundial_common.stores.dispatch import PlannedExecution
from sundial_common.stores.executions import Outcome
from sundial_common.stores.types import Occurrence
from sundial_infra.servers.postgres import PostgresServer
from sundial_infra.stack import BENCH_PORTS

from bench import machine, results
from bench.harness import EXECUTION_UPDATES, POSTGRES_SETTINGS, fresh_database
from bench.results import REPO, RESULTS

TENANT = "bench-storage"
#: The statements measured, by the comment that opens each (pg_stat_statements keeps it).
STATEMENTS = {
    "lock_due": "-- The claimed members that are due in Postgres%",
    "insert": "-- One row per occurrence%",
    "start": "-- PENDING -> RUNNING for a batch%",
    "finish": "-- RUNNING -> how the attempt ended%",
}


async def prepare(server: PostgresServer, name: str, revision: str, rows: int, days: int, audit_days: int) -> str:
    # Planning is where partitions cost (every partition a statement may touch is planned): count it too.
    dsn = await fresh_database(server, name, revision, track_planning=True)
    conn = await asyncpg.connect(dsn)
    try:
        today = datetime.now(UTC).date()
        if revision != "0017":
            await conn.fetchval("SELECT sundial_add_execution_partitions($1::date, $2::int)", today, days)
        if revision not in ("0017", "0019"):
            await conn.fetchval("SELECT sundial_add_audit_partitions($1::date, $2::int)", today, audit_days)
        await conn.execute("INSERT INTO tenants (id) VALUES ($1)", TENANT)
        job = new_id()
        await conn.execute(
            "INSERT INTO jobs (id, tenant_id, name, type, pool, handler, timeout_sec, state, shard)"
            " VALUES ($1, $2, 'old', 'ONE_SHOT', 'bench', 'echo', 60, 'COMPLETED', 0)",
            job,
            TENANT,
        )
        start = datetime.now(UTC) - timedelta(hours=1)
        for offset in range(0, rows, 10_000):
            n = min(10_000, rows - offset)
            ids = [new_id() for _ in range(n)]
            await conn.execute(
                "INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler,"
                " state, timeout_sec, worker_id, started_at, finished_at, published_at)"
                " SELECT id, $2, $3, $4::timestamptz + make_interval(secs => ($5 + n)::int), 0, 1, 'bench', 'echo',"
                " 'SUCCEEDED', 60, 'w', now(), now(), now() FROM unnest($1::uuid[]) WITH ORDINALITY AS u (id, n)",
                ids,
                TENANT,
                job,
                start,
                offset,
            )
            await conn.execute(
                "INSERT INTO execution_attempts (execution_id, attempt, tenant_id, worker_id, state, finished_at)"
                " SELECT id, 1, $2, 'w', 'SUCCEEDED', now() FROM unnest($1::uuid[]) AS u (id)",
                ids,
                TENANT,
            )
            if audit_days:
                await conn.execute(
                    "INSERT INTO audit_log (tenant_id, entity, entity_id, action, actor)"
                    " SELECT $2, 'execution', id, a, 'w' FROM unnest($1::uuid[]) AS u (id),"
                    " unnest(ARRAY['dispatch', 'start', 'finish']) AS x (a)",
                    ids,
                    TENANT,
                )
        # The analytics service would have drained these; autovacuum would have analysed the tables.
        await conn.execute("DELETE FROM execution_events")
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()
    return dsn


#: The backends of this database's pool (all its connections are open: min_size = max_size).
PIDS = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'"
    " ORDER BY backend_start DESC LIMIT $1"
)


async def due_jobs(conn: asyncpg.Connection | asyncpg.Pool, batch: int) -> tuple[datetime, list[Any]]:
    """``batch`` one-shot jobs of shard 0 due now (the instant and their ids), as the API would have made them."""
    due = from_ms(to_ms(datetime.now(UTC)))
    jobs = [new_id() for _ in range(batch)]
    await conn.execute(
        "INSERT INTO jobs (id, tenant_id, name, type, run_at, pool, handler, timeout_sec, state, shard, next_fire_at)"
        " SELECT id, $2, 'j', 'ONE_SHOT', $3, 'bench', 'echo', 60, 'ACTIVE', 0, $3 FROM unnest($1::uuid[]) AS u (id)",
        jobs,
        TENANT,
        due,
    )
    return due, jobs


async def one_round(stores: Stores, batch: int, worker: str) -> dict[str, float]:
    """``batch`` due jobs: dispatched, started, finished; wall milliseconds of each call."""
    due, jobs = await due_jobs(stores.database.pool, batch)

    def plan(rows: Any) -> list[PlannedExecution]:
        return [PlannedExecution(new_id(), row, None, None) for row in rows]

    took: dict[str, float] = {}
    started = time.perf_counter()
    created = await stores.dispatch.dispatch(0, 1, "bench", [Occurrence(j, due) for j in jobs], plan)
    took["dispatch"] = (time.perf_counter() - started) * 1000
    ids = [p.execution_id for p in created]
    started = time.perf_counter()
    won = await stores.executions.start_executions(worker, [(i, 1) for i in ids])
    took["start"] = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    done = await stores.executions.finish_attempts(worker, [Outcome(i, 1, "SUCCEEDED") for i in ids])
    took["finish"] = (time.perf_counter() - started) * 1000
    assert len(created) == len(won) == len(done) == batch, (len(created), len(won), len(done))
    return took


def backend_ticks(pids: list[int]) -> int:
    """utime + stime clock ticks of the given Postgres backends so far (/proc)."""
    return sum(machine.cpu_ticks(pid) for pid in pids)


async def statement_means(conn: asyncpg.Connection) -> dict[str, dict[str, float]]:
    found = {}
    for name, pattern in STATEMENTS.items():
        row = await conn.fetchrow(
            "SELECT sum(calls) AS calls, sum(total_exec_time) / sum(calls) AS mean_ms,"
            " sum(total_plan_time) / sum(calls) AS plan_ms,"
            " sum(shared_blks_hit + shared_blks_read) / sum(calls) AS blocks"
            " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND query LIKE $1",
            pattern,
        )
        if row and row["calls"]:
            found[name] = {
                "calls": int(row["calls"]),
                "mean_ms": round(float(row["mean_ms"]), 3),
                "plan_ms": round(float(row["plan_ms"]), 3),
                "blocks_per_call": round(float(row["blocks"]), 1),
            }
    return found


async def updated(conn: asyncpg.Connection) -> dict[str, int]:
    """Updates of executions' partitions since the stats were reset, and how many were heap-only. An idle backend
    reports its counters within 10 s (PostgreSQL 15's idle stats interval)."""
    row = await conn.fetchrow(EXECUTION_UPDATES)
    return {"updates": int(row["updates"]), "heap_only": int(row["heap_only"])}


async def main_async(args: argparse.Namespace) -> None:
    root = args.root.resolve()
    shutil.rmtree(root, ignore_errors=True)
    server = PostgresServer(root / "postgres", BENCH_PORTS.postgres + args.port_offset, settings=POSTGRES_SETTINGS)
    server.start()
    flat = "head" if args.variant else args.flat
    audit_days = args.audit_days if flat == "0019" else 0
    try:
        modes = {
            "flat": await prepare(server, "storage_flat", flat, args.rows, args.days, audit_days),
            "partitioned": await prepare(server, "storage_partitioned", "head", args.rows, args.days, audit_days),
        }
        if args.variant:
            conn = await asyncpg.connect(modes["flat"])
            try:
                await conn.execute(args.variant.read_text())
            finally:
                await conn.close()
        stores = {mode: await Stores.connect(dsn, min_size=2, max_size=2) for mode, dsn in modes.items()}
        try:
            for mode in modes:
                await one_round(stores[mode], args.batch, "warm")  # plans cached, buffers warm
                await stores[mode].database.pool.execute("SELECT pg_stat_statements_reset(), pg_stat_reset()")
            timings: dict[str, dict[str, list[float]]] = {m: {} for m in modes}
            # Each database's backends (its pool's two connections) and the WAL its rounds wrote: one database
            # runs at a time, so the server's WAL position moves for that one only (autovacuum aside).
            backends = {
                mode: [r["pid"] for r in await s.database.pool.fetch(PIDS, s.database.pool.get_size())]
                for mode, s in stores.items()
            }
            ticks = dict.fromkeys(modes, 0)
            wal = dict.fromkeys(modes, 0)
            order = list(modes)
            for r in range(args.rounds):
                for mode in order if r % 2 == 0 else reversed(order):
                    pool = stores[mode].database.pool
                    lsn, before = await pool.fetchval("SELECT pg_current_wal_lsn()"), backend_ticks(backends[mode])
                    for call, ms in (await one_round(stores[mode], args.batch, f"w{r}")).items():
                        timings[mode].setdefault(call, []).append(ms)
                    ticks[mode] += backend_ticks(backends[mode]) - before
                    wal[mode] += await pool.fetchval("SELECT pg_current_wal_lsn() - $1::pg_lsn", lsn)
            result: dict[str, Any] = {}
            await asyncio.sleep(11)
            for mode in modes:
                async with stores[mode].database.pool.acquire() as conn:
                    means = await statement_means(conn)
                    partitions = await conn.fetchval(
                        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'executions'::regclass"
                    )
                    audit_partitions = await conn.fetchval(
                        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'audit_log'::regclass"
                    )
                    updates = await updated(conn)
                result[mode] = {
                    "partitions": partitions,
                    "audit_partitions": audit_partitions,
                    "median_ms": {call: round(statistics.median(v), 2) for call, v in timings[mode].items()},
                    "statements": means,
                    "backend_cpu_ms_per_execution": round(
                        ticks[mode] / os.sysconf("SC_CLK_TCK") * 1000 / (args.rounds * args.batch), 4
                    ),
                    "wal_bytes_per_execution": round(float(wal[mode]) / (args.rounds * args.batch)),
                    "executions_updates": updates,
                }
        finally:
            for s in stores.values():
                await s.close()
    finally:
        server.stop()
    settings = {
        "rows": args.rows,
        "batch": args.batch,
        "rounds": args.rounds,
        "days": args.days,
        "flat": flat,
        "variant": args.variant.read_text() if args.variant else None,
        "audit_days": audit_days,
    }
    results.record("storage", result, settings, results=args.results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench storage", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=300_000, help="finished executions in each database first")
    parser.add_argument("--days", type=int, default=40, help="daily partitions of the partitioned database")
    parser.add_argument(
        "--flat",
        choices=("0017", "0019", "0022"),
        default="0017",
        help="the revision to compare the head with (see above)",
    )
    parser.add_argument(
        "--variant", type=Path, help="a SQL file applied to the head as `flat`, measured against the head (see above)"
    )
    parser.add_argument("--audit-days", type=int, default=98, help="with --flat 0019: daily partitions of audit_log")
    parser.add_argument("--batch", type=int, default=250, help="executions per dispatch, start and finish")
    parser.add_argument("--rounds", type=int, default=40, help="measured rounds per database")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--root", type=Path, default=REPO / ".sundial" / "bench-storage")
    parser.add_argument("--port-offset", type=int, default=0, help="ports = BENCH_PORTS + this (a multiple of 100)")
    asyncio.run(main_async(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
