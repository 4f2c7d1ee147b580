"""Scale at rest: N recurring jobs registered, and what they cost while they wait.

    uv run python -m bench at-rest                 # 1,000,000 jobs, 4 shards, its own servers
    uv run python -m bench at-rest --jobs 100000   # smaller
    uv run python -m bench at-rest --jobs 10000000 --keep   # W4 at 10M (~10 min here); then --reuse measures
                                                            # again without registering, and deletes the data

It starts its own Postgres and Redis (``LocalStack`` on the bench ports + ``--port-offset``, under
``.sundial/bench-at-rest/``, wiped first), migrates, and registers ``--jobs`` recurring jobs straight into
Postgres with COPY (as a bulk registration would; the API path is measured elsewhere): a realistic mix of
daily and hourly cron jobs in several time zones and intervals from 5 minutes to a day, each with its next
fire computed by ``sundial_common.domain.schedules`` exactly as the API does. Then it measures:

* Postgres size: the ``jobs`` heap, each of its indexes, the database;
* the hydrator: one pass from an empty Redis (a rebuild: promotes the whole hot window; and when every shard
  had its next minute back, ``rebuild_next_minute_ms``), then steady
  passes a second apart (most read only the watermarks; one in each promotion slice scans the slice
  that entered the window), and the overdue scan; plus the plan of one promotion page, to show it is an
  index range scan and never a table scan;
* Redis: hot-window members and memory; the servers' memory (PSS).

It prints one JSON line and appends it to ``bench/results/<workload>.jsonl``. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import dataclasses
import functools
import json
import os
import random
import shutil
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from redis.asyncio import Redis
from sundial_common.domain.ids import new_id, shard_for
from sundial_common.domain.schedules import Kind, ScheduleSpec, fire_at, next_fire
from sundial_common.hotwindow.window import HotWindow
from sundial_common.stores import Stores
from sundial_common.stores.jobs import Q
from sundial_common.stores.schema import upgrade
from sundial_common.stores.types import Occurrence, RetryDue
from sundial_hydrator.hydrator import Hydrator, HydratorConfig
from sundial_infra.stack import BENCH_PORTS, LocalStack, Ports

from bench import results
from bench.results import REPO, RESULTS
from bench.workloads.idle import Sampler

#: The keys of :func:`main_async`'s line that say how it was run (its settings, :mod:`bench.results`).
SETTINGS = ("jobs", "created_by", "shards")
ZONES = ["UTC", "America/New_York", "America/Los_Angeles", "Europe/London", "Europe/Berlin", "Asia/Kolkata"]
TENANT = "bench-at-rest"
#: Jobs per COPY (and per chunk built ahead in the child process).
CHUNK = 100_000
COLUMNS = [
    "id", "tenant_id", "name", "type", "schedule", "timezone", "interval_sec", "start_at", "pool", "handler",
    "payload", "timeout_sec", "state", "shard", "jitter_sec", "next_nominal_at", "next_fire_at",
]  # fmt: skip


class FixedClock:
    def __init__(self, now: datetime) -> None:
        self.current = now

    def now(self) -> datetime:
        return self.current

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


@functools.lru_cache(maxsize=200_000)
def _next_fire(spec: ScheduleSpec, now: datetime) -> datetime:
    """``next_fire``, once per distinct schedule: the mix has a few thousand (most of the Python time at 10M)."""
    nominal = next_fire(spec, now)
    assert nominal is not None
    return nominal


def job_record(i: int, tenant: str, shards: int, now: datetime, rng: random.Random) -> tuple[Any, ...]:
    """One job of the mix: 60% daily cron, 25% hourly cron, 15% intervals; a tenth of them jittered."""
    job_id = new_id()
    zone = rng.choice(ZONES)
    kind = rng.random()
    interval = start = None
    if kind < 0.6:
        schedule: str | None = f"{rng.randrange(60)} {rng.randrange(24)} * * *"
        spec = ScheduleSpec(Kind.CRON, timezone=zone, cron=schedule)
    elif kind < 0.85:
        schedule = f"{rng.randrange(60)} * * * *"
        spec = ScheduleSpec(Kind.CRON, timezone=zone, cron=schedule)
    else:
        schedule = None
        interval = rng.choice([300, 900, 3600, 4 * 3600, 86400])
        start = now - timedelta(seconds=rng.randrange(interval))
        spec = ScheduleSpec(Kind.INTERVAL, timezone=zone, interval_sec=interval, start_at=start)
    jitter = 60 if i % 10 == 0 else 0
    nominal = _next_fire(spec, now)
    return (
        job_id, tenant, f"job-{i}", spec.kind.value, schedule, zone, interval, start, "reports", "build",
        {"report": i % 1000}, 600, "ACTIVE", shard_for(job_id, shards), jitter, nominal,
        fire_at(job_id, nominal, jitter),
    )  # fmt: skip


def job_chunk(offset: int, end: int, shards: int, now: datetime) -> list[tuple[Any, ...]]:
    """Jobs ``offset`` to ``end``, from a chunk's own seeded RNG (the same jobs in any order of building)."""
    rng = random.Random(f"42-{offset}")
    return [job_record(i, TENANT, shards, now, rng) for i in range(offset, end)]


async def register(dsn: str, count: int, shards: int, now: datetime) -> float:
    """COPY ``count`` jobs in chunks, progress on stderr; returns the rows per second.

    A thread builds the next chunk while this one waits for Postgres to take the current one, so the two
    overlap (a child process would spend longer pickling the rows than building them).
    """
    conn = await asyncpg.connect(dsn)
    # COPY speaks binary: jsonb is a version byte, then the JSON text.
    await conn.set_type_codec(
        "jsonb",
        schema="pg_catalog",
        encoder=lambda value: b"\x01" + json.dumps(value).encode(),
        decoder=lambda data: json.loads(data[1:]),
        format="binary",
    )
    started = time.perf_counter()
    loop = asyncio.get_running_loop()
    bounds = [(offset, min(count, offset + CHUNK)) for offset in range(0, count, CHUNK)]
    try:
        await conn.execute("INSERT INTO tenants (id) VALUES ($1) ON CONFLICT DO NOTHING", TENANT)
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as builder:
            ahead = collections.deque(loop.run_in_executor(builder, job_chunk, *b, shards, now) for b in bounds[:2])
            for index, (_offset, end) in enumerate(bounds):
                batch = await ahead.popleft()
                if index + 2 < len(bounds):
                    ahead.append(loop.run_in_executor(builder, job_chunk, *bounds[index + 2], shards, now))
                await conn.copy_records_to_table("jobs", records=batch, columns=COLUMNS)
                elapsed = time.perf_counter() - started
                _progress(f"registered {end:,}/{count:,} jobs ({end / elapsed:,.0f}/s, {elapsed:,.0f}s)")
        _progress("VACUUM ANALYZE jobs")
        await conn.execute("VACUUM ANALYZE jobs")
    finally:
        await conn.close()
    return count / (time.perf_counter() - started)


def _progress(message: str) -> None:
    print(f"{datetime.now(UTC):%H:%M:%S} at_rest: {message}", file=sys.stderr, flush=True)


async def sizes(dsn: str) -> dict[str, Any]:
    conn = await asyncpg.connect(dsn)
    try:
        indexes = await conn.fetch(
            "SELECT indexrelid::regclass::text AS name, pg_relation_size(indexrelid) AS bytes "
            "FROM pg_index WHERE indrelid = 'jobs'::regclass ORDER BY 1"
        )
        row = await conn.fetchrow(
            "SELECT pg_relation_size('jobs') AS heap, pg_total_relation_size('jobs') AS total, "
            "pg_database_size(current_database()) AS database, (SELECT count(*) FROM jobs) AS jobs"
        )
        assert row is not None
        plan = await conn.fetch(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + Q["hydration_ranges"].rstrip().rstrip(";"),
            [0],
            [datetime.now(UTC)],
            [uuid.UUID(int=0)],
            datetime.now(UTC) + timedelta(hours=1),
            5000,
        )
    finally:
        await conn.close()
    mib = 2**20
    return {
        "jobs_heap_mib": round(row["heap"] / mib, 1),
        "jobs_indexes_mib": {r["name"]: round(r["bytes"] / mib, 1) for r in indexes},
        "jobs_total_mib": round(row["total"] / mib, 1),
        "database_mib": round(row["database"] / mib, 1),
        "bytes_per_job": round(row["total"] / max(1, row["jobs"])),
        "promotion_page_plan": [r[0] for r in plan],
    }


class _NextMinuteWatch(HotWindow):
    """The hot window, noting when a rebuild has put back, per shard, every member due within the next minute."""

    def __init__(self, redis: Redis, now: datetime) -> None:
        super().__init__(redis)
        self.minute = now + timedelta(minutes=1)
        self.started = time.perf_counter()
        self.ready_s: dict[int, float] = {}

    async def hydrate(
        self,
        shard: int,
        expected: int | None,
        new_watermark: int | None,
        occurrences: Sequence[Occurrence],
        retries: Sequence[RetryDue] = (),
    ) -> bool:
        ok = await super().hydrate(shard, expected, new_watermark, occurrences, retries)
        past_minute = new_watermark is not None or bool(occurrences and occurrences[-1].due >= self.minute)
        if ok and past_minute and shard not in self.ready_s:
            self.ready_s[shard] = time.perf_counter() - self.started
        return ok


async def hydrate(dsn: str, redis_url: str, shards: int, now: datetime, steady_passes: int) -> dict[str, Any]:
    stores = await Stores.connect(dsn)
    redis = Redis.from_url(redis_url)
    clock = FixedClock(now)
    try:
        await redis.flushall()
        watch = _NextMinuteWatch(redis, now)
        hydrator = Hydrator(stores, watch, HydratorConfig(shards=shards), clock=clock)
        started = watch.started = time.perf_counter()
        cold = await hydrator.run_once()  # also runs the overdue scan (first pass)
        cold_s = time.perf_counter() - started
        steady = []
        scanning = []  # the passes that scanned Postgres (a promotion slice's worth of the window's edge)
        promoted = 0
        for _ in range(steady_passes):
            clock.current += timedelta(seconds=1)
            started = time.perf_counter()
            result = await hydrator.run_once()
            steady.append(time.perf_counter() - started)
            if result.scanned_shards:
                scanning.append(steady[-1])
            promoted += result.promoted
        overdue_started = time.perf_counter()
        before = clock.current - timedelta(seconds=15)
        await stores.jobs.overdue_occurrences(range(shards), before, 5000)
        await stores.dispatch.overdue_retries(range(shards), before, 5000)
        overdue_s = time.perf_counter() - overdue_started
        members = sum([await HotWindow(redis).size(s) for s in range(shards)])
        memory = (await redis.info("memory"))["used_memory"]
    finally:
        await redis.aclose()
        await stores.close()
    steady.sort()
    return {
        "rebuild_pass_ms": round(cold_s * 1000, 1),
        "rebuild_promoted": cold.promoted,
        # When every shard had its members due within the next minute back (the latest shard), and each shard.
        "rebuild_next_minute_ms": round(max(watch.ready_s.values(), default=0) * 1000, 1),
        "rebuild_next_minute_ms_by_shard": [round(watch.ready_s.get(s, 0) * 1000, 1) for s in range(shards)],
        "steady_pass_ms": {
            "p50": round(steady[len(steady) // 2] * 1000, 2),
            "max": round(steady[-1] * 1000, 2),
            "passes": len(steady),
            "promoted_per_pass": round(promoted / max(1, len(steady)), 1),
            "scanning_passes": len(scanning),
            "scanning_pass_ms_max": round(max(scanning, default=0) * 1000, 2),
        },
        "overdue_scan_ms": round(overdue_s * 1000, 2),
        "hot_window_members": members,
        "redis_used_memory_mib": round(memory / 2**20, 1),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    ports = Ports(**{f.name: getattr(BENCH_PORTS, f.name) + args.port_offset for f in dataclasses.fields(Ports)})
    root = REPO / ".sundial" / "bench-at-rest"
    stack = LocalStack(root, ports, durable=False)
    registered = root / "registered.json"  # what a --keep run registered, for a --reuse run
    reuse = args.reuse and registered.exists()
    if not reuse:
        stack.stop()
        shutil.rmtree(root, ignore_errors=True)
    stack.start()
    try:
        dsn = stack.postgres_dsn
        if reuse:
            kept = json.loads(registered.read_text())
            now, rate = datetime.fromisoformat(kept["now"]), kept["rate"]
            if (kept["jobs"], kept["shards"]) != (args.jobs, args.shards):
                raise SystemExit(f"--reuse: {root} holds {kept['jobs']} jobs over {kept['shards']} shards")
        else:
            await upgrade(dsn)
            now = datetime.now(UTC).replace(microsecond=0)
            rate = await register(dsn, args.jobs, args.shards, now)
            registered.write_text(json.dumps({"now": now.isoformat(), "rate": rate, **vars(args)}))
        _progress("measuring table and index sizes")
        postgres = await sizes(dsn)
        _progress("hydrating: a rebuild from an empty Redis, then steady passes")
        hydrator = await hydrate(dsn, stack.redis_url, args.shards, now, args.steady_passes)
        servers = {pid: server.name for server, pid in stack.status() if pid}
        result = {
            "jobs": args.jobs,
            "created_by": "COPY",
            "shards": args.shards,
            "register_rows_per_s": round(rate),
            "postgres": postgres,
            "hydrator": hydrator,
            # Postgres with its backends (shared buffers counted once) and Redis holding the hot window.
            "servers_pss_mib": Sampler(servers).pss_mib(),
            "loadavg": os.getloadavg(),
        }
    finally:
        if not args.keep:
            stack.stop()
            shutil.rmtree(root, ignore_errors=True)  # gigabytes at 10M jobs
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench at-rest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000, help="Recurring jobs to register.")
    parser.add_argument("--shards", type=int, default=4, help="Dispatcher shards (hot-window ZSETs).")
    parser.add_argument("--steady-passes", type=int, default=30, help="Steady hydrator passes to time.")
    parser.add_argument("--port-offset", type=int, default=10, help="Added to the bench ports (BENCH_PORTS).")
    parser.add_argument("--keep", action="store_true", help="Leave the servers and their data afterwards.")
    parser.add_argument(
        "--reuse", action="store_true", help="Measure again what a --keep run registered (no wipe, no COPY)."
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="Directory of the <workload>.jsonl files.")
    args = parser.parse_args(argv)
    line = asyncio.run(main_async(args))
    results.record("w4", line, {key: line.pop(key) for key in SETTINGS}, results=args.results, cpu_probe=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
