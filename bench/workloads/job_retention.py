"""Job retention: what the sweeper's ``job-retention`` loop costs per job it deletes (jobs a second).

One Postgres (the bench's settings, pg_stat_statements); per case a fresh database at the head, filled with
``--jobs`` jobs of which ``--ended`` (a fraction) ended 40 days ago and the rest are ACTIVE, analysed, then
emptied of its ended jobs by the store call the loop makes (``prune_ended_jobs``, ``--batch`` a transaction)
until a batch comes back empty. Cases:

* ``one-shot/0022``: ended one-shot jobs, deleted by migration 0022's statement (one-shot jobs only; a job any
  edge names stays) — the earlier statement, kept here to compare;
* ``one-shot/head``: the same backlog, deleted by the head's statement (any type, with the edges, triggers and
  backfills that hang off a job);
* ``mixed/head``: what the head deletes beyond one-shot jobs: cancelled CRON jobs (one in ten with a finished
  backfill), completed INTERVAL jobs, and cancelled DEPENDENT jobs, each the child of one of the cancelled CRON
  jobs (a parent goes once its child has: the case needs a second round of batches).

Per case: the jobs deleted, wall seconds, jobs a second, the median wall milliseconds of a full batch, and from
pg_stat_statements the mean execution milliseconds of the statement per batch. Cases alternate over
``--repeat`` rounds so a drifting load falls on each.

    uv run --frozen python -m bench job-retention --port-offset 900

A measurement, never a pass/fail. Appends one JSON line to ``bench/results/<workload>.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from sundial_common.stores.jobs import Q
from sundial_infra.servers.postgres import PostgresServer
from sundial_infra.stack import BENCH_PORTS

from bench import results
from bench.harness import POSTGRES_SETTINGS, fresh_database
from bench.results import REPO, RESULTS

TENANT = "bench-retention"
CASES = ("one-shot/0022", "one-shot/head", "mixed/head")

#: Migration 0022's statement (the one this round replaced), to compare on the same backlog.
PRUNE_0022 = """
WITH ended AS (
    SELECT j.id FROM jobs j
    WHERE j.state IN ('COMPLETED', 'CANCELLED') AND j.type IN ('ONE_SHOT', 'DELAYED') AND j.updated_at < $1
      AND j.trigger_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM job_dependencies d WHERE d.parent_job_id = j.id)
      AND NOT EXISTS (SELECT 1 FROM job_dependencies d WHERE d.child_job_id = j.id)
    ORDER BY j.updated_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM jobs j USING ended WHERE j.id = ended.id RETURNING 1
)
SELECT count(*) FROM gone"""

#: The filling statement: $1 jobs, $2 of them ended (40 days ago, a millisecond apart), $3 the case's kind.
FILL = """
INSERT INTO jobs (id, tenant_id, name, type, pool, handler, timeout_sec, state, shard, updated_at)
SELECT gen_random_uuid(), $4, 'bench', t.type, 'bench', 'echo', 60, t.state, 0,
       CASE WHEN i <= $2 THEN now() - interval '40 days' + i * interval '1 millisecond' ELSE now() END
FROM generate_series(1, $1) AS i,
LATERAL (SELECT CASE
    WHEN i > $2 THEN 'ONE_SHOT'
    WHEN $3 = 'one-shot' THEN 'ONE_SHOT'
    WHEN i % 5 IN (0, 1) THEN 'CRON'
    WHEN i % 5 = 2 THEN 'INTERVAL'
    ELSE 'DEPENDENT' END AS type) AS k,
LATERAL (SELECT k.type,
    CASE WHEN i > $2 THEN 'ACTIVE' WHEN k.type IN ('ONE_SHOT', 'INTERVAL') THEN 'COMPLETED' ELSE 'CANCELLED' END
    AS state) AS t
"""

#: The mixed case's graph and backfills: each DEPENDENT job the child of a cancelled CRON job (paired in order),
#: one cancelled CRON job in ten with a backfill that finished with it.
GRAPH = """
WITH parents AS (
    SELECT id, row_number() OVER (ORDER BY updated_at) AS n FROM jobs WHERE type = 'CRON'
), children AS (
    SELECT id, row_number() OVER (ORDER BY updated_at) AS n FROM jobs WHERE type = 'DEPENDENT'
), edges AS (
    INSERT INTO job_dependencies (child_job_id, parent_job_id, tenant_id, on_state)
    SELECT c.id, p.id, $1, 'SUCCEEDED' FROM children c JOIN parents p USING (n)
)
INSERT INTO backfills (id, tenant_id, job_id, shard, range_from, range_to, overlap_policy, rate_per_sec, state,
                       total, finished_at)
SELECT gen_random_uuid(), $1, j.id, 0, j.updated_at - interval '1 day', j.updated_at, 'ALLOW', 10, 'DONE', 1,
       j.updated_at
FROM jobs j WHERE j.type = 'CRON' AND j.state = 'CANCELLED' AND j.updated_at < now() - interval '1 day'
  AND (hashtext(j.id::text) % 10) = 0
"""


async def prepare(server: PostgresServer, case: str, jobs: int, ended: int) -> str:
    dsn = await fresh_database(server, "job_retention", "head")
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("INSERT INTO tenants (id) VALUES ($1)", TENANT)
        await conn.execute(FILL, jobs, ended, case.split("/")[0], TENANT)
        if case.startswith("mixed"):
            await conn.execute(GRAPH, TENANT)
        await conn.execute("VACUUM ANALYZE")
        await conn.execute("SELECT pg_stat_statements_reset()")
    finally:
        await conn.close()
    return dsn


async def measure(dsn: str, case: str, batch: int) -> dict[str, Any]:
    statement = PRUNE_0022 if case.endswith("0022") else Q["prune_ended_jobs"]
    before = datetime.now(UTC) - timedelta(days=2)
    conn = await asyncpg.connect(dsn)
    try:
        walls: list[float] = []
        deleted = 0
        began = time.perf_counter()
        while True:  # rounds of batches until one deletes nothing (a parent goes a round after its child)
            went_this_round = 0
            while True:
                t0 = time.perf_counter()
                went = int(await conn.fetchval(statement, before, batch))
                if went == batch:
                    walls.append((time.perf_counter() - t0) * 1000)
                went_this_round += went
                if went < batch:
                    break
            deleted += went_this_round
            if went_this_round == 0:
                break
        wall = time.perf_counter() - began
        stats = await conn.fetchrow(
            "SELECT sum(calls) AS calls, sum(total_exec_time) AS exec_ms FROM pg_stat_statements"
            " WHERE query LIKE '%WITH ended AS%' AND query NOT LIKE '%pg_stat_statements%'"
        )
        left = await conn.fetchval("SELECT count(*) FROM jobs WHERE state IN ('COMPLETED', 'CANCELLED')")
    finally:
        await conn.close()
    return {
        "deleted": deleted,
        "left_ended": left,
        "wall_s": round(wall, 2),
        "jobs_per_s": round(deleted / wall) if wall else None,
        "batch_wall_ms_median": round(statistics.median(walls), 1) if walls else None,
        "exec_ms_per_1000": round(stats["exec_ms"] / deleted * 1000, 1) if deleted and stats["exec_ms"] else None,
        "statements": int(stats["calls"] or 0),
    }


async def main_async(args: argparse.Namespace) -> None:
    root = args.root.resolve()
    shutil.rmtree(root, ignore_errors=True)
    server = PostgresServer(root / "postgres", BENCH_PORTS.postgres + args.port_offset, settings=POSTGRES_SETTINGS)
    server.start()
    ended = int(args.jobs * args.ended)
    cases: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    try:
        for round_ in range(args.repeat):
            order = CASES if round_ % 2 == 0 else tuple(reversed(CASES))
            for case in order:
                dsn = await prepare(server, case, args.jobs, ended)
                result = await measure(dsn, case, args.batch)
                print(case, result, flush=True)
                cases[case].append(result)
    finally:
        server.stop()
    settings = {"jobs": args.jobs, "ended": ended, "batch": args.batch}
    results.record("job-retention", {"cases": cases}, settings, results=args.results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench job-retention", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=300_000, help="jobs in each case's database")
    parser.add_argument("--ended", type=float, default=0.9, help="the fraction of them that ended long ago")
    parser.add_argument("--batch", type=int, default=1000, help="jobs deleted per transaction (the loop's default)")
    parser.add_argument("--repeat", type=int, default=2, help="rounds over the cases, alternating their order")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--root", type=Path, default=REPO / ".sundial" / "bench-job-retention")
    parser.add_argument("--port-offset", type=int, default=0, help="ports = BENCH_PORTS + this (a multiple of 100)")
    asyncio.run(main_async(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
