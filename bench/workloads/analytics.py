"""The ClickHouse replica's figures (``python -m bench analytics``): ingest rate, freshness, stats over 10M rows.

Three measurements, on a Postgres of the bench's own (``BENCH_PORTS.postgres + --port-offset``) and the
embedded chDB engine under ``--root`` (the defaults of ``make run``):

- ``ingest``: ``--events`` lifecycle events queued in the ``execution_events`` outbox (written by the real
  triggers: executions inserted, then finished), drained by the real :class:`Ingester` at its default batch
  size — events/s from outbox read to outbox delete, ClickHouse insert included.
- ``freshness``: executions created and finished in small transactions at ``--rate`` per second for
  ``--duration`` s (W2's rate is 333/s) while the ingester runs at its defaults; for each, the time from
  its final state's commit to its insert into ClickHouse (P50/P95/P99).
- ``query``: ``--rows`` executions of one tenant (plus 10 % of other tenants' and 10 % older versions that
  FINAL must collapse) generated inside ClickHouse over 30 days, then ``GET /v1/stats/executions``'s query
  (30 days by day × state; and by hour × handler over 7 days) and the handler ranking, each run 5 times.

One JSON line per measurement goes to stdout and ``bench/results/analytics.jsonl`` (:mod:`bench.results`).
It measures; it never passes or fails.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from sundial_analytics.ingest import IngestConfig, Ingester
from sundial_analytics.replica import ClickHouseReplica, ReplicaConfig
from sundial_common.domain.ids import new_id
from sundial_common.stores import Stores

from bench import results
from bench.figures import percentiles
from bench.harness import add_own_server_options, own_postgres

TENANT = "bench"
#: The keys of a measurement's line that say how it was run (its settings, :mod:`bench.results`).
SETTINGS = ("measure", "rate_per_s", "duration_s", "rows")


async def _seed_job(conn: asyncpg.Connection) -> uuid.UUID:
    job_id = new_id()
    await conn.execute("INSERT INTO tenants (id) VALUES ($1) ON CONFLICT DO NOTHING", TENANT)
    await conn.execute(
        "INSERT INTO jobs (id, tenant_id, name, type, pool, handler, timeout_sec, shard, state, run_at)"
        " VALUES ($1, $2, 'bench', 'ONE_SHOT', 'bench', 'work', 60, 0, 'COMPLETED', now())",
        job_id,
        TENANT,
    )
    return job_id


_INSERT = """
INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler, state, timeout_sec)
SELECT id, $2, $3, s, 0, 1, 'bench', 'h' || (n % 20), 'PENDING', 60
FROM unnest($1::uuid[], $4::timestamptz[]) WITH ORDINALITY AS t(id, s, n)
"""
_FINISH = """
UPDATE executions SET state = CASE WHEN random() < 0.05 THEN 'DEAD' ELSE 'SUCCEEDED' END,
    started_at = now() - interval '20 ms', finished_at = now(), worker_id = 'w', error = 'ValueError: x'
WHERE id = ANY($1::uuid[])
"""


async def _executions(conn: asyncpg.Connection, job_id: uuid.UUID, count: int, base: datetime) -> list[uuid.UUID]:
    ids = [new_id() for _ in range(count)]
    times = [base + timedelta(milliseconds=i) for i in range(count)]
    await conn.execute(_INSERT, ids, TENANT, job_id, times)
    return ids


async def bench_ingest(dsn: str, replica: ClickHouseReplica, events: int) -> dict[str, Any]:
    conn = await asyncpg.connect(dsn)
    stores = await Stores.connect(dsn, max_size=2)
    try:
        job_id = await _seed_job(conn)
        base = datetime.now(UTC)
        for offset in range(0, events // 2, 10_000):
            ids = await _executions(conn, job_id, min(10_000, events // 2 - offset), base + timedelta(seconds=offset))
            await conn.execute(_FINISH, ids)
        queued = await stores.analytics.pending_events()
        in_clickhouse = 0.0

        class Timed:
            async def insert(self, rows: bytes) -> None:
                nonlocal in_clickhouse
                t = time.perf_counter()
                await replica.insert(rows)
                in_clickhouse += time.perf_counter() - t

        # The first insert of a process pays chDB's one-off start of its insert path (seconds): not a rate.
        await Ingester(stores.analytics, replica, IngestConfig(batch_size=100)).run_once()
        ingester = Ingester(stores.analytics, Timed(), IngestConfig())  # type: ignore[arg-type]
        started = time.perf_counter()
        drained = 0
        while (result := await ingester.run_once()).events:
            drained += result.events
        seconds = time.perf_counter() - started
        return {
            "measure": "ingest",
            "events": drained,
            "queued": queued,
            "batch_size": ingester.config.batch_size,
            "seconds": round(seconds, 2),
            "events_per_s": round(drained / seconds),
            "clickhouse_insert_s": round(in_clickhouse, 2),
        }
    finally:
        await stores.close()
        await conn.close()


async def bench_freshness(dsn: str, replica: ClickHouseReplica, rate: int, duration: float) -> dict[str, Any]:
    """Final-state commit → ClickHouse insert, per execution, under a steady rate of executions."""
    committed: dict[uuid.UUID, float] = {}
    inserted: dict[uuid.UUID, float] = {}

    class Timed:
        async def insert(self, rows: bytes) -> None:
            await replica.insert(rows)
            now = time.perf_counter()
            for row in rows.splitlines():
                fields = row.split(b"\t", 6)  # EVENT_COLUMNS: kind third, execution_id sixth
                if fields[2] in (b"finished", b"dead_lettered"):
                    inserted.setdefault(uuid.UUID(fields[5].decode()), now)

        def __getattr__(self, name: str) -> Any:
            return getattr(replica, name)

    stores = await Stores.connect(dsn, max_size=4)
    conn = await asyncpg.connect(dsn)
    stop = asyncio.Event()
    ingester = Ingester(stores.analytics, Timed(), IngestConfig())

    async def ingest() -> None:
        config = ingester.config
        while not stop.is_set() or await stores.analytics.pending_events():
            result = await ingester.run_once()
            if not result.full(config):
                await asyncio.sleep(config.interval_sec)

    try:
        job_id = await _seed_job(conn)
        task = asyncio.create_task(ingest())
        tick, per_tick = 0.05, max(1, round(rate * 0.05))
        started = time.perf_counter()
        base = datetime.now(UTC) + timedelta(days=1)
        n = 0
        while time.perf_counter() - started < duration:
            ids = await _executions(conn, job_id, per_tick, base + timedelta(seconds=n))
            await conn.execute(_FINISH, ids)
            now = time.perf_counter()
            committed.update(dict.fromkeys(ids, now))
            n += 1
            await asyncio.sleep(max(0.0, started + n * tick - time.perf_counter()))
        stop.set()
        await task
    finally:
        await conn.close()
        await stores.close()
    lags = [(inserted[i] - committed[i]) * 1000 for i in committed if i in inserted]
    return {
        "measure": "freshness",
        "rate_per_s": rate,
        "duration_s": duration,
        "executions": len(committed),
        "replicated": len(lags),
        "commit_to_clickhouse_ms": percentiles(lags),
    }


_GENERATE = """
INSERT INTO {db}.executions (tenant_id, scheduled_for, execution_id, version, updated_at, job_id, attempt, state, pool,
    handler, fire_at, created_at, started_at, finished_at, lateness_ms, duration_ms, worker_id, error_class)
SELECT
    {tenant} AS tenant_id,
    toDateTime64('{start}', 3, 'UTC') + toIntervalMillisecond(intDiv(number * 2592000000, {span})) AS scheduled_for,
    toUUID(concat('00000000-0000-7000-8000-', leftPad(lower(hex(number)), 12, '0'))) AS execution_id,
    {version} AS version,
    scheduled_for AS updated_at,
    generateUUIDv4(number % 1000) AS job_id,
    1 AS attempt,
    if({version} = 1, 'RUNNING', multiIf(number % 20 = 0, 'DEAD', number % 50 = 1, 'TIMED_OUT', 'SUCCEEDED')) AS state,
    concat('pool-', toString(number % 5)) AS pool,
    concat('handler-', toString(number % 40)) AS handler,
    scheduled_for AS fire_at,
    scheduled_for AS created_at,
    scheduled_for AS started_at,
    scheduled_for AS finished_at,
    toInt64(number % 200) AS lateness_ms,
    toInt64((number * 7919) % 5000) AS duration_ms,
    concat('worker-', toString(number % 16)) AS worker_id,
    if(number % 20 = 0, 'ValueError', '') AS error_class
FROM numbers({rows})
"""


async def bench_query(replica: ClickHouseReplica, rows: int) -> dict[str, Any]:
    start = datetime(2026, 10, 1, tzinfo=UTC)
    db = replica.config.database

    def generate(tenant: str, count: int, version: int) -> str:
        # Row n of every statement has the same id and time: version 1 of an execution and its version 2
        # share their sort key, as re-sent and older states do.
        stamp = start.strftime("%Y-%m-%d %H:%M:%S")
        return _GENERATE.format(db=db, tenant=f"'{tenant}'", start=stamp, rows=count, span=rows, version=version)

    t0 = time.perf_counter()
    # Older versions first (RUNNING), the final states after: FINAL must pick the later version of each.
    statements = [
        generate(TENANT, rows // 10, 1),
        generate(TENANT, rows, 2),
        generate("other-a", rows // 20, 2),
        generate("other-b", rows // 20, 2),
    ]
    for sql in statements:
        await replica._call(lambda client, sql=sql: client.command(sql))
    generated = time.perf_counter() - t0
    timings: dict[str, list[float]] = {"by_day_state_30d": [], "by_hour_handler_7d": [], "handlers_30d": []}
    # chDB runs in this process: its CPU time is this process's (all threads), the machine-independent cost.
    cpu: dict[str, list[float]] = {name: [] for name in timings}
    answers: dict[str, Any] = {}
    end = start + timedelta(days=30)
    for _ in range(5):
        queries: dict[str, Callable[[], Awaitable[list[dict[str, Any]]]]] = {
            "by_day_state_30d": lambda: replica.execution_stats(TENANT, start, end, "day", "state"),
            "by_hour_handler_7d": lambda: replica.execution_stats(
                TENANT, start, start + timedelta(days=7), "hour", "handler"
            ),
            "handlers_30d": lambda: replica.handler_stats(TENANT, start, end),
        }
        for name, query in queries.items():
            t, c = time.perf_counter(), time.process_time()
            answers[name] = await query()
            timings[name].append((time.perf_counter() - t) * 1000)
            cpu[name].append((time.process_time() - c) * 1000)
    counted = sum(row["executions"] for row in answers["by_day_state_30d"])
    return {
        "measure": "query",
        "rows": rows,
        "tenant_executions_counted": counted,
        "generate_s": round(generated, 1),
        "query_ms": {name: percentiles(values) for name, values in timings.items()},
        "query_cpu_ms": {name: percentiles(values) for name, values in cpu.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench analytics", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("measures", nargs="*", default=["ingest", "freshness", "query"])
    parser.add_argument("--events", type=int, default=200_000, help="ingest: events queued (default 200,000)")
    parser.add_argument("--rate", type=int, default=333, help="freshness: executions per second (W2: 333)")
    parser.add_argument("--duration", type=float, default=30.0, help="freshness: seconds")
    parser.add_argument("--rows", type=int, default=10_000_000, help="query: executions of the queried tenant")
    add_own_server_options(parser, "analytics")
    args = parser.parse_args(argv)

    postgres = own_postgres(args.root, args.port_offset)
    replica = ClickHouseReplica(ReplicaConfig(url=None, chdb_path=(args.root / "chdb").resolve()))
    try:

        async def run() -> None:
            await replica.ensure_schema()
            for measure in args.measures:
                if measure == "ingest":
                    line = await bench_ingest(postgres.dsn, replica, args.events)
                elif measure == "freshness":
                    line = await bench_freshness(postgres.dsn, replica, args.rate, args.duration)
                elif measure == "query":
                    line = await bench_query(replica, args.rows)
                else:
                    raise SystemExit(f"unknown measure {measure!r}")
                settings = {key: line.pop(key) for key in SETTINGS if key in line}
                results.record("analytics", line, settings, results=args.results)

        asyncio.run(run())
    finally:
        replica.close()
        postgres.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
