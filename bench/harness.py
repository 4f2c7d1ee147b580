"""`make bench`: start a Sundial stack of a chosen shape on its own ports and measure it.

Workloads (seed 002 targets: P95 dispatch latency < 1 s; 1M dispatches/min on a fleet):

- ``create``  API create rate under wrk: single POSTs (with and without Idempotency-Key) and batches (create.py).
- ``w1``      burst: N one-shot jobs all due at the same instant (``--burst 10000,100000``).
- ``w2``      spread: 20,000 jobs due uniformly over 60 s.
- ``w3``      sustained: a target rate of due executions per second for ``--duration`` s
              (``--rates 1000,2500,5000,10000``).
- ``w4``      at rest: N future recurring jobs (bench/at_rest.py); hydrator passes; table and index sizes.
- ``idle``    the ``make up`` stack doing nothing: CPU per process over 60 s, memory (bench/idle.py).
- ``idle-floor`` the same servers alone (set up, no Sundial process): the floor under ``idle`` (not in the default).
- ``ceilings`` the raw parts: Postgres batched inserts, Redis ZADD and claim, broker produce/consume.

Dispatch workloads insert their jobs straight into Postgres (COPY, as a bulk registration would), so
what they measure is the scheduling path: hydrator → hot window → dispatcher → Kafka → worker. Each
prints one JSON line and appends it to ``bench/results/<date>.jsonl`` with the machine, the git commit
and the settings. A benchmark measures and records; it never passes or fails on timing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
from redis.asyncio import Redis
from sundial_common.domain.ids import new_id, shard_for
from sundial_common.hotwindow.window import HotWindow
from sundial_common.runtime.settings import CommonSettings
from sundial_common.security.auth import issue_token
from sundial_common.security.encryption import PAYLOAD, EncryptionSettings, TenantCipher, open_keyring
from sundial_common.stores import Stores
from sundial_common.stores.schema import upgrade
from sundial_common.stores.types import Occurrence
from sundial_infra.process import wait_for
from sundial_infra.servers.postgres import PostgresServer
from sundial_infra.stack import BENCH_PORTS, LocalStack, Ports
from sundial_infra.supervisor import ProcessSpec, Supervisor, sundial_argv
from sundial_worker.consumer import consumer_group

sys.path.insert(0, str(Path(__file__).parent))
import api_burst
import at_rest
import ceilings
import create
import idle
import leftover
import machine

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
#: W4 (at_rest.py) runs on the bench ports + the run's offset + this, so it never meets a stack the run left.
AT_REST_PORT_OFFSET = 10
POOL = "demo"
#: The bench's progress poll: a tenant's jobs not fired yet and its open executions (a partial index of open jobs,
#: the range of the tenant's OPEN phase in executions_tenant_phase_idx).
REMAINING = """SELECT (SELECT count(*) FROM jobs WHERE tenant_id = $1 AND state = 'ACTIVE')
     + (SELECT count(*) FROM executions WHERE tenant_id = $1 AND phase = 'OPEN')"""
SUCCEEDED = "SELECT count(*) FROM executions WHERE tenant_id = $1 AND phase = 'SUCCEEDED'"
#: How often the run read each index of executions (the partitions' scans, by the index's name without the day).
INDEX_SCANS = """
SELECT regexp_replace(indexrelname, '^executions_(p[0-9]{8}|legacy)_', '') AS index, sum(idx_scan)::bigint
FROM pg_stat_user_indexes
WHERE relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'executions'::regclass)
GROUP BY 1 ORDER BY 1"""
#: Updates of executions' partitions since the stats were reset, and how many were heap-only (no index entry).
EXECUTION_UPDATES = """
SELECT coalesce(sum(n_tup_upd), 0) AS updates, coalesce(sum(n_tup_hot_upd), 0) AS heap_only
FROM pg_stat_user_tables
WHERE relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'executions'::regclass)"""
#: Make the pool admit one more tenant (shared among every bench tenant; registered by `migrate --pool`).
ADMIT = """
UPDATE pools SET owner = NULL,
    shared_with = (SELECT array_agg(DISTINCT t ORDER BY t) FROM unnest(shared_with || ARRAY[owner, $2]) AS t
                   WHERE t IS NOT NULL)
WHERE name = $1
"""
#: A production Postgres is tuned; the defaults (128 MB buffers, 1 GB of WAL between checkpoints) are a
#: laptop's. pg_stat_statements says which statements the database time goes to.
POSTGRES_SETTINGS = {
    "shared_buffers": "512MB",
    "max_wal_size": "4GB",
    "checkpoint_timeout": "15min",
    "shared_preload_libraries": "pg_stat_statements",
    # Planning is counted too (a statement planned over every partition pays it at each call).
    "pg_stat_statements.track_planning": "on",
}


@dataclass(frozen=True)
class Shape:
    shards: int
    dispatchers: int
    workers: int
    concurrency: int
    durable: bool
    #: The ClickHouse replica's outbox triggers and the analytics service (off: its cost is measured by difference).
    analytics: bool = True
    #: Empty daily partitions of executions and attempts made for this many past days, as a stack that has run
    #: that long with the default retention (30) carries: 38 partitions of each, not a fresh stack's 8 (today
    #: and a week ahead). Every statement that is not pruned at plan time plans each partition.
    past_days: int = 30


def _postgres_ticks_by_client(postgres_pid: int, clients: dict[str, int]) -> dict[int, tuple[str, int]]:
    """Each Postgres process's utime + stime ticks so far and who it works for: a backend under the name of the
    process tree in ``clients`` that holds its connection's other end (the client port in its process title), the
    server's own processes by their title (``autovacuum launcher``, ``checkpointer``, ``walwriter``...); the
    postmaster is ``exited`` (its ticks include the processes it reaped: autovacuum workers, closed connections).
    Read from /proc only, twice a run: the same source as :meth:`Bench.cpu`."""
    parents, usage = machine.proc_table()
    ticks = {pid: u.ticks for pid, u in usage.items()}
    # The local port of every TCP socket (inode -> port), then which client process holds each socket: a process
    # counts for its nearest ancestor named in ``clients`` (machine.owner); the harness for itself only (its tree
    # holds every supervised process and the servers).
    port_of_inode: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                port_of_inode[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    roots = {pid: name for name, pid in clients.items()}
    client_of_port: dict[int, str] = {}
    for pid in parents:
        name = machine.owner(pid, parents, roots)
        if name is None or (name == "harness" and pid != clients["harness"]):
            continue
        with contextlib.suppress(OSError):
            for fd in os.scandir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(fd.path)
                    if link.startswith("socket:[") and (port := port_of_inode.get(link[8:-1])) is not None:
                        client_of_port.setdefault(port, name)
    owners: dict[int, tuple[str, int]] = {postgres_pid: ("exited", ticks.get(postgres_pid, 0))}
    for pid in (pid for pid, parent in parents.items() if parent == postgres_pid):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        client = re.search(r"\((\d+)\)", title)
        if client:
            name = client_of_port.get(int(client.group(1)), "other client")
        else:
            name = title.removeprefix("postgres: ").strip()
        owners[pid] = (name, ticks.get(pid, 0))
    return owners


def _postgres_by_client(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]]) -> dict[str, float]:
    """Postgres's CPU seconds between two ``_postgres_ticks_by_client`` reads, by who asked (a process alive at
    both reads counts its difference, one that started between them all of its ticks)."""
    seconds: dict[str, float] = {}
    for pid, (name, now) in after.items():
        seconds[name] = seconds.get(name, 0.0) + (now - before.get(pid, (name, 0))[1]) / os.sysconf("SC_CLK_TCK")
    return {name: round(s, 2) for name, s in sorted(seconds.items(), key=lambda item: -item[1])}


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)

    return {"p50": round(statistics.median(ordered), 1), "p95": at(0.95), "p99": at(0.99), "max": round(ordered[-1], 1)}


class Bench:
    def __init__(self, shape: Shape, root: Path, ports: Ports = BENCH_PORTS, profile: Path | None = None) -> None:
        self.shape = shape
        self.ports = ports
        #: Where py-spy writes one collapsed-stack profile per Sundial process and workload (None: no profiling).
        self.profile = profile
        self.stack = LocalStack(root, ports, durable=shape.durable, postgres_settings=POSTGRES_SETTINGS)
        self.root = root
        env = {
            **self.stack.env(),
            "SUNDIAL_SHARDS": str(shape.shards),
            "SUNDIAL_LOG_LEVEL": "INFO",
            "SUNDIAL_WORKER_CONCURRENCY": str(shape.concurrency),
        }
        self.env = env
        processes = [
            ProcessSpec("api", sundial_argv("api", "--host", "127.0.0.1", "--port", str(ports.api))),
            ProcessSpec("hydrator", sundial_argv("hydrator")),
            ProcessSpec("sweeper", sundial_argv("sweeper")),
            *(ProcessSpec(f"dispatcher-{i}", sundial_argv("dispatcher")) for i in range(shape.dispatchers)),
            *(
                ProcessSpec(f"worker-{i}", sundial_argv("worker", "--app", "sundial_worker.demo:worker"))
                for i in range(shape.workers)
            ),
        ]
        if shape.analytics:
            # The ClickHouse replica is fed under every workload: its outbox triggers and drain are part of the cost.
            analytics_env = (
                ("SUNDIAL_ANALYTICS_CHDB_PATH", str(root / "analytics" / "chdb")),
                ("SUNDIAL_ANALYTICS_PORT", str(ports.api + 44)),
            )
            processes.append(ProcessSpec("analytics", sundial_argv("analytics"), env=analytics_env))
        self.supervisor = Supervisor(processes, env={**os.environ, **env}, log_dir=root / "logs", run_dir=root / "run")
        self.token = issue_token(CommonSettings(env="dev").jwt_secret, "bench-api")

    def start(self) -> None:
        """A fresh stack and the supervised processes; if any of it fails (a worker never assigned), what did
        start is stopped: left running, it would join the next run's servers on the same ports."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        # A fresh stack every run: measurements must not depend on what an earlier run left behind.
        self.stack.stop()
        shutil.rmtree(self.root, ignore_errors=True)
        self.stack.start()
        subprocess.run(
            [*sundial_argv("migrate", "--tenant", "bench-api", "--pool", f"{POOL}=bench-api")],
            env={**os.environ, **self.env},
            check=True,
            capture_output=True,
        )
        self.stack.postgres.psql(
            "CREATE EXTENSION IF NOT EXISTS pg_stat_statements", database=self.stack.postgres.database
        )
        if self.shape.past_days:
            self.stack.postgres.psql(
                "SELECT sundial_add_execution_partitions((now() AT TIME ZONE 'UTC')::date"
                f" - {self.shape.past_days}, {self.shape.past_days})",
                database=self.stack.postgres.database,
            )
        if not self.shape.analytics:
            self.stack.postgres.psql(
                "ALTER TABLE executions DISABLE TRIGGER executions_events_created,"
                " DISABLE TRIGGER executions_events_changed",
                database=self.stack.postgres.database,
            )
        self.supervisor.start()
        api = f"http://127.0.0.1:{self.ports.api}/readyz"
        if not wait_for(lambda: _ok(api), timeout=60):
            raise RuntimeError(f"bench api not ready; see {self.supervisor.log_file('api')}")
        for i in range(self.shape.workers):
            log = self.supervisor.log_file(f"worker-{i}")
            if not wait_for(
                lambda log=log: log.exists() and "partitions assigned" in log.read_text(errors="replace"), timeout=60
            ):
                raise RuntimeError(f"worker-{i} got no partitions; see {log}")

    def stop(self) -> None:
        self.supervisor.stop()
        self.stack.stop()

    def cpu(self) -> dict[str, machine.Usage]:
        """Each process's usage so far, with what it forked (Postgres its backends): :func:`machine.cpu_fields`
        of two reads is a line's CPU."""
        roots = {s.pid: s.name for s in self.supervisor.status() if s.pid}
        for server, pid in self.stack.status():
            if pid:
                roots[pid] = type(server).__name__.removesuffix("Server").lower()
        return machine.usage_of_trees(roots)

    def postgres_ticks(self) -> dict[int, tuple[str, int]]:
        """Postgres's processes' ticks so far and who each works for (``_postgres_ticks_by_client``): the
        supervised processes and this bench (``harness``: its progress poll)."""
        postgres = next((pid for server, pid in self.stack.status() if isinstance(server, PostgresServer) and pid), 0)
        clients = {s.name: s.pid for s in self.supervisor.status() if s.pid}
        return _postgres_ticks_by_client(postgres, {**clients, "harness": os.getpid()}) if postgres else {}

    # --- workloads ---------------------------------------------------------------------------

    async def cipher(self, tenant: str) -> TenantCipher:
        """The tenant's data key, from the stack's master key: the bench registers jobs sealed, as the API does."""
        stores = await Stores.connect(self.stack.postgres_dsn, min_size=1, max_size=1)
        try:
            settings = EncryptionSettings(**{"env": "dev", "dev_root": str(self.root)})
            return await (await open_keyring(settings, stores.keys)).cipher(tenant)
        finally:
            await stores.close()

    async def insert_jobs(
        self,
        tenant: str,
        due: Sequence[datetime],
        *,
        handler: str = "echo",
        payload: dict[str, Any] | None = None,
        priority: str = "NORMAL",
    ) -> float:
        """COPY one-shot jobs due at ``due`` into Postgres (``echo`` of ``{"i": i}`` unless told); returns seconds
        taken."""
        conn = await asyncpg.connect(self.stack.postgres_dsn)
        try:
            started = time.perf_counter()
            await conn.execute("INSERT INTO tenants (id) VALUES ($1) ON CONFLICT DO NOTHING", tenant)
            cipher = await self.cipher(tenant)
            await conn.execute(ADMIT, POOL, tenant)  # the workers run only tenants their pool admits
            records = []
            for i, instant in enumerate(due):
                job_id = new_id()
                records.append(
                    (
                        job_id,
                        tenant,
                        f"bench-{i}",
                        "ONE_SHOT",
                        instant,
                        POOL,
                        handler,
                        # sealed, as the API does
                        orjson.dumps(cipher.seal_json({"i": i} if payload is None else payload, PAYLOAD)).decode(),
                        60,
                        "ACTIVE",
                        shard_for(job_id, self.shape.shards),
                        instant,
                        priority,
                    )
                )
            await conn.copy_records_to_table(
                "jobs",
                records=records,
                columns=[
                    "id",
                    "tenant_id",
                    "name",
                    "type",
                    "run_at",
                    "pool",
                    "handler",
                    "payload",
                    "timeout_sec",
                    "state",
                    "shard",
                    "next_fire_at",
                    "priority",
                ],
            )
            # Like the API, the registrar puts near-due jobs into the hot window itself: the hydrator
            # only promotes beyond its watermark (and re-adds overdue jobs after a grace).
            redis = Redis.from_url(self.stack.redis_url)
            try:
                hot = HotWindow(redis)
                by_shard: dict[int, list[Occurrence]] = {}
                for r in records:
                    by_shard.setdefault(r[10], []).append(Occurrence(r[0], r[11]))
                for shard, occurrences in by_shard.items():
                    for offset in range(0, len(occurrences), 5000):
                        await hot.add(shard, occurrences[offset : offset + 5000])
            finally:
                await redis.aclose()
            return time.perf_counter() - started
        finally:
            await conn.close()

    async def run_dispatch(
        self, workload: str, due: list[datetime], settle_sec: float = 75.0, create: str = "copy"
    ) -> dict[str, Any]:
        if create == "api":  # as a user would: POST /v1/jobs:batch (bench/api_burst.py)
            tenant = api_burst.TENANT
            insert_s = await api_burst.create_jobs(f"http://127.0.0.1:{self.ports.api}", self.token, POOL, due)
        else:
            tenant = f"bench-{workload}-{uuid.uuid4().hex[:6]}"
            insert_s = await self.insert_jobs(tenant, due)
        inserted_at = datetime.now(UTC)
        # CPU and statements count from here: registering the jobs is not what the workload measures.
        cpu_before = self.cpu()
        postgres_before = self.postgres_ticks()
        conn = await asyncpg.connect(self.stack.postgres_dsn)
        await conn.execute("SELECT pg_stat_statements_reset()")
        wal_before = await conn.fetchval("SELECT pg_current_wal_lsn()")
        profilers = self._profile(f"{workload}-{len(due)}", (max(due) - inserted_at).total_seconds() + 5)
        try:
            last_due = max(due)
            # Lost = not done after settle_sec without progress: longer than the sweeper's republish of an
            # execution published and never started (60 s), so a message the broker dropped is late, not lost.
            # The poll counts what is left, not what is done: the tenant's jobs not fired yet and its open
            # executions, each through a partial index of open rows, so a poll costs what the backlog holds
            # (a count of every SUCCEEDED row grew with the run: 4-7 s of statement time in a W3 run, counted in
            # the Postgres CPU the line reports). Only once nothing is left are the SUCCEEDED rows counted; start
            # once the last job is due, so the measurement takes no database time from what it measures.
            await asyncio.sleep(max(0.0, (last_due - datetime.now(UTC)).total_seconds()))
            progress_at = time.monotonic()
            left, done = None, 0
            while True:
                now_left = await conn.fetchval(REMAINING, tenant)
                if now_left != left:
                    left, progress_at = now_left, time.monotonic()
                if now_left == 0:
                    done = await conn.fetchval(SUCCEEDED, tenant)
                    if done >= len(due):
                        break
                if datetime.now(UTC) > last_due and time.monotonic() - progress_at > settle_sec:
                    done = await conn.fetchval(SUCCEEDED, tenant)
                    break
                # A poll costs what is left (each count reads the backlog's index entries: ~0.1 s of Postgres
                # at 100,000 left, 1.7-2.8 s of a W1 100,000 run's statement time at one poll a second), so a
                # large backlog is polled less often; from 10,000 left down it is every second.
                await asyncio.sleep(min(5.0, max(1.0, now_left / 10_000)))
            # CPU and statements stop counting here: the read below is the bench's own (2.5 s of Postgres CPU
            # for 75,000 rows, a sixth of what a 30 s W3 run's Postgres line used to report).
            cpu_after = self.cpu()
            postgres_after = self.postgres_ticks()
            # Something left: where it was (bench/leftover.py), read while the stack still runs.
            left_behind: dict[str, Any] | None = None
            if done < len(due):
                try:
                    left_behind = await leftover.describe(
                        conn, tenant, self.stack.kafka_bootstrap, POOL, consumer_group(POOL)
                    )
                except Exception as exc:  # a diagnosis that fails must not cost the run's line
                    left_behind = {"error": repr(exc)}
            statements = await _top_statements(conn)
            wal_bytes = await conn.fetchval("SELECT pg_current_wal_lsn() - $1::pg_lsn", wal_before)
            # The updates of executions since the stack started, and how many were heap-only (no index entry
            # written; migration 0023). An idle backend reports its counts within 10 s: the last may be missing.
            updates = await conn.fetchrow(EXECUTION_UPDATES)
            rows = await conn.fetch(
                """SELECT e.scheduled_for, e.started_at, e.finished_at, e.created_at, e.published_at,
                          (SELECT count(*) FROM execution_attempts a WHERE a.execution_id = e.id) AS starts
                   FROM executions e WHERE e.tenant_id = $1 AND e.started_at IS NOT NULL""",
                tenant,
            )
            partitions = await conn.fetchval(
                "SELECT count(*) FROM pg_inherits WHERE inhparent = 'executions'::regclass"
            )
            index_scans = dict(await conn.fetch(INDEX_SCANS))
        finally:
            await conn.close()
            for profiler in profilers:
                profiler.wait()
        lateness = [(r["started_at"] - r["scheduled_for"]).total_seconds() * 1000 for r in rows]
        first_due = min(due)
        finished = [r["finished_at"] for r in rows if r["finished_at"]]
        span = (max(finished) - first_due).total_seconds() if finished else None
        return {
            "jobs": len(due),
            "created": "API batch" if create == "api" else "COPY",
            "insert_rows_per_s": round(len(due) / insert_s),
            "inserted_before_first_due_s": round((first_due - inserted_at).total_seconds(), 2),
            "succeeded": done,
            "lost": len(due) - done,
            **({"left_behind": left_behind} if left_behind is not None else {}),
            "duplicate_starts": sum(r["starts"] - 1 for r in rows if r["starts"] > 1),
            "lateness_ms": _percentiles(lateness),
            # The same, for the jobs due in the run's first 5 s and for the rest: a slow start (a pool's queue cap
            # still growing, the first passes) shows as a tail of the first phase alone.
            "lateness_by_phase_ms": _by_phase(rows, first_due, 5.0),
            # Where the first start's lateness went: execution row committed, message produced, start CAS done.
            "first_start_ms": _first_start(rows),
            # Where every start's lateness went, stage by stage (percentiles of each stage's own duration).
            "stages_ms": _stages(rows),
            # How many executions were committed / produced before their due instant (the publish lead, a burst
            # published ahead): that part of the dispatch path was paid before the instant.
            "before_due": _before_due(rows),
            "all_started_after_due_s": round((max(r["started_at"] for r in rows) - last_due).total_seconds(), 2)
            if rows
            else None,
            "completion_per_s": round(len(finished) / span) if span else None,
            **machine.cpu_fields(cpu_before, cpu_after),
            # Postgres's CPU by who asked for it: each backend under its client's process, the server's own by name.
            "postgres_by_client": _postgres_by_client(postgres_before, postgres_after),
            "postgres_statements": statements,
            "postgres_wal_bytes": int(wal_bytes),
            "execution_updates": {k: int(v) for k, v in updates.items()},
            "execution_partitions": partitions,
            "execution_index_scans": index_scans,
        }

    def _profile(self, label: str, seconds: float) -> list[subprocess.Popen[bytes]]:
        """py-spy on a dispatcher, a worker and the analytics service for ``seconds`` (collapsed stacks)."""
        if self.profile is None:
            return []
        self.profile.mkdir(parents=True, exist_ok=True)
        pids = {s.name: s.pid for s in self.supervisor.status() if s.pid}
        return [
            subprocess.Popen(
                [
                    "py-spy",
                    "record",
                    "--format",
                    "raw",
                    "--rate",
                    "200",
                    "--nonblocking",
                    "--duration",
                    str(max(1, round(seconds))),
                    "--pid",
                    str(pids[name]),
                    "--output",
                    str(self.profile / f"{label}-{name}.txt"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for name in ("dispatcher-0", "worker-0", "analytics")
            if name in pids
        ]


async def _top_statements(conn: asyncpg.Connection, limit: int = 8) -> list[dict[str, Any]]:
    """Where the database time went: the statements with the most execution and planning time since the last
    reset (``total_ms`` executing, ``plan_ms`` planning, ``plans`` how many times planned)."""
    rows = await conn.fetch(
        """SELECT calls, plans, rows, total_exec_time, total_plan_time,
                  left(regexp_replace(query, '\\s+', ' ', 'g'), 90) AS query
           FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%'
           ORDER BY total_exec_time + total_plan_time DESC LIMIT $1""",
        limit,
    )
    return [
        {
            "query": r["query"],
            "calls": r["calls"],
            # Times planned: a statement run under a generic plan (the census) is planned once per connection.
            "plans": r["plans"],
            "rows": r["rows"],
            "total_ms": round(r["total_exec_time"]),
            "plan_ms": round(r["total_plan_time"]),
        }
        for r in rows
    ]


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


async def fresh_database(
    server: PostgresServer, name: str, revision: str = "head", *, track_planning: bool = False
) -> str:
    """A new database ``name`` on ``server`` (dropped first if it exists), migrated to ``revision``, with
    pg_stat_statements (its planning time counted too if ``track_planning``): its DSN. For the statement benches."""
    admin = await asyncpg.connect(server.dsn)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {name}")
        if track_planning:
            await admin.execute(f"ALTER DATABASE {name} SET pg_stat_statements.track_planning = on")
    finally:
        await admin.close()
    dsn = server.dsn_for(name)
    await upgrade(dsn, revision)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    finally:
        await conn.close()
    return dsn


def _record(line: dict[str, Any], results: Path = RESULTS) -> None:
    text = json.dumps(line, default=str)
    print(text, flush=True)
    results.mkdir(parents=True, exist_ok=True)
    with (results / f"{datetime.now(UTC):%Y-%m-%d}.jsonl").open("a") as out:
        out.write(text + "\n")


async def main_async(args: argparse.Namespace) -> None:
    shape = Shape(
        args.shards,
        args.dispatchers,
        args.workers,
        args.concurrency,
        not args.no_durable,
        not args.no_analytics,
        args.past_days,
    )
    ports = Ports(**{k: v + args.port_offset for k, v in vars(BENCH_PORTS).items()})
    bench = Bench(shape, args.root, ports, args.profile)
    record = functools.partial(_record, results=args.results)
    meta = {"machine": machine.describe(REPO), "settings": vars(shape), "at": datetime.now(UTC).isoformat()}
    if "idle" in args.workloads:
        # The `make up` stack doing nothing: CPU per process over 60 s, memory (bench/idle.py).
        root = args.root.with_name(args.root.name + "-idle")
        machine_at = {k: v for k, v in meta.items() if k != "settings"}  # its shape is make up's, not --shards…
        record({**idle.measure(root, args.port_offset, settle=30.0, seconds=60.0), **machine_at})
    if "idle-floor" in args.workloads:
        root = args.root.with_name(args.root.name + "-idle")
        machine_at = {k: v for k, v in meta.items() if k != "settings"}
        record({**idle.measure(root, args.port_offset, settle=30.0, seconds=60.0, servers_only=True), **machine_at})
    if "ceilings" in args.workloads:
        # The parts alone, before Sundial's processes compete for the cores.
        bench.stack.start()
        try:
            record(
                {
                    "workload": "ceilings",
                    **await ceilings.measure_all(
                        bench.stack.postgres_dsn, bench.stack.redis_url, bench.stack.kafka_bootstrap, args.scale
                    ),
                    **meta,
                }
            )
        finally:
            bench.stack.stop()
    if "w4" in args.workloads:
        # At rest: N future recurring jobs, one hydrator rebuild and steady passes, table and index sizes.
        at_rest_args = argparse.Namespace(
            jobs=int(args.at_rest * args.scale),
            shards=args.shards,
            steady_passes=30,
            port_offset=args.port_offset + AT_REST_PORT_OFFSET,
            keep=False,
            reuse=False,
        )
        result = await at_rest.main_async(at_rest_args)
        record({**result, "workload": "w4", **meta})
    if "create" in args.workloads:
        # One API process under wrk, single and batch creates, on a stack of their own (bench/create.py).
        for line in await create.measure(bench, duration=max(2.0, 20 * args.scale)):
            record({**line, **meta})
    # Each run on a fresh stack: the broker keeps every message in memory and Postgres keeps every
    # execution, so a run measured after another would pay for what the earlier one left behind.
    runs: list[tuple[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]]]] = []
    for n in (int(b * args.scale) for b in args.burst) if "w1" in args.workloads else []:
        runs.append(({"workload": "w1", "burst": n}, functools.partial(_burst, bench, n, args)))
    if "w2" in args.workloads:
        n = int(20_000 * args.scale)
        runs.append(({"workload": "w2", "over_s": args.duration}, functools.partial(_spread, bench, "w2", n, args)))
    for rate in args.rates if "w3" in args.workloads else []:
        head = {"workload": "w3", "target_per_s": rate, "duration_s": args.duration}
        runs.append((head, functools.partial(_spread, bench, "w3", int(rate * args.duration), args)))
    for head, run in runs:
        bench.start()
        try:
            record({**head, **await run(), **meta})
        finally:
            bench.stop()


async def _burst(bench: Bench, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """W1: ``n`` one-shot jobs, all due at one instant."""
    per_s = 5_000 if args.create == "api" else 50_000  # time to register them before they are due
    due = _ms(datetime.now(UTC) + timedelta(seconds=args.lead + n / per_s))
    return await bench.run_dispatch("w1", [due] * n, create=args.create)


async def _spread(bench: Bench, workload: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """W2/W3: ``n`` one-shot jobs due uniformly over ``--duration`` seconds."""
    start = datetime.now(UTC) + timedelta(seconds=args.lead + n / 50_000)
    return await bench.run_dispatch(workload, [_ms(start + timedelta(seconds=args.duration * i / n)) for i in range(n)])


def _first_start(rows: Sequence[Any]) -> dict[str, float | None] | None:
    if not rows:
        return None
    first = min(rows, key=lambda r: r["started_at"])

    def after_due(at: datetime | None) -> float | None:
        return round((at - first["scheduled_for"]).total_seconds() * 1000, 1) if at is not None else None

    return {
        k: after_due(first[c])
        for k, c in (("committed", "created_at"), ("produced", "published_at"), ("started", "started_at"))
    }


def _stages(rows: Sequence[Any]) -> dict[str, dict[str, float | None]]:
    """Per stage, its duration's percentiles: due → dispatch transaction began (``created_at``) → message produced
    (``published_at``: the broker timestamp, the producer's create time) → start CAS began (``started_at``).
    The last stage holds the linger, the broker's ack, the consumer's fetch and the worker's batching."""
    stages: dict[str, list[float]] = {"dispatch": [], "produce": [], "consume_start": []}
    for r in rows:
        if r["published_at"] is None:
            continue
        stages["dispatch"].append((r["created_at"] - r["scheduled_for"]).total_seconds() * 1000)
        stages["produce"].append((r["published_at"] - r["created_at"]).total_seconds() * 1000)
        stages["consume_start"].append((r["started_at"] - r["published_at"]).total_seconds() * 1000)
    return {name: _percentiles(values) for name, values in stages.items()}


def _before_due(rows: Sequence[Any]) -> dict[str, int]:
    """Executions whose dispatch transaction began (``created_at``) / whose message was produced (``published_at``)
    before their due instant (``scheduled_for``)."""
    return {
        "committed": sum(1 for r in rows if r["created_at"] < r["scheduled_for"]),
        "produced": sum(1 for r in rows if r["published_at"] is not None and r["published_at"] < r["scheduled_for"]),
    }


def _by_phase(rows: Sequence[Any], first_due: datetime, head_sec: float) -> dict[str, dict[str, float | None]]:
    """Lateness percentiles of the jobs due within ``head_sec`` of the first due instant, and of the others."""
    phases: dict[str, list[float]] = {f"first_{head_sec:g}s": [], "rest": []}
    head, rest = phases.values()
    for r in rows:
        late = (r["started_at"] - r["scheduled_for"]).total_seconds() * 1000
        (head if (r["scheduled_for"] - first_due).total_seconds() < head_sec else rest).append(late)
    return {name: _percentiles(values) for name, values in phases.items()}


def _ms(instant: datetime) -> datetime:
    return instant.replace(microsecond=instant.microsecond // 1000 * 1000)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/harness.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "workloads",
        nargs="*",
        default=["idle", "ceilings", "create", "w1", "w2", "w3", "w4"],
        help="which workloads (default: all)",
    )
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--dispatchers", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=256, help="handler slots per worker")
    parser.add_argument("--burst", type=_ints, default=[10_000, 100_000], help="W1 sizes")
    parser.add_argument("--rates", type=_ints, default=[1000, 2500, 5000, 10000], help="W3 rates per second")
    parser.add_argument("--duration", type=float, default=60.0, help="W2/W3 seconds")
    parser.add_argument("--at-rest", type=int, default=1_000_000, help="W4 jobs")
    parser.add_argument("--lead", type=float, default=5.0, help="seconds between registration and first due")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every count (0.01 = smoke)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="directory of the <date>.jsonl files")
    parser.add_argument("--root", type=Path, default=REPO / ".sundial" / "bench", help="the stack's data directory")
    parser.add_argument(
        "--port-offset",
        type=int,
        default=0,
        help="ports = the bench ports (sundial_infra.stack.BENCH_PORTS) + this; a multiple of 100, at most 1500",
    )
    parser.add_argument("--profile", type=Path, help="py-spy a dispatcher, a worker and analytics into this directory")
    parser.add_argument(
        "--create", choices=["api", "copy"], default="api", help="W1: jobs created through POST /v1/jobs:batch or COPY"
    )
    parser.add_argument("--no-durable", action="store_true", help="Postgres without fsync (as in tests)")
    parser.add_argument(
        "--past-days",
        type=int,
        default=30,
        help="empty daily partitions of executions made for this many past days, as a stack that has run that long"
        " with the default 30-day retention carries (38 partitions); 0: a fresh stack's 8",
    )
    parser.add_argument(
        "--no-analytics",
        action="store_true",
        help="without the ClickHouse replica: outbox triggers disabled, no analytics service (its cost by difference)",
    )
    args = parser.parse_args(argv)
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
