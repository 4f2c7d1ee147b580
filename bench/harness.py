"""The bench's public harness: a Sundial stack of a chosen shape on the bench ports, and a dispatch run on it.

:class:`Shape` says how many shards, dispatchers and workers; :class:`Bench` starts a fresh stack of that shape
(:meth:`Bench.start`, :meth:`Bench.stop`), registers jobs straight into Postgres (:meth:`Bench.insert_jobs`: COPY, as a
bulk registration would, :mod:`bench.registration`) and measures the scheduling path — hydrator → hot window →
dispatcher → Kafka → worker — from registration until every job ran (:meth:`Bench.run_dispatch`), with each process's
CPU (:meth:`Bench.cpu`). :func:`fresh_database` gives the statement benches a migrated database of their own,
:func:`own_postgres` (with :func:`add_own_server_options`) the benches of one component a migrated Postgres of their
own; :func:`ports_at` the bench ports moved by an offset; :func:`burst` and :func:`spread` the due instants of W1 and of
W2/W3. A benchmark measures and records; it never passes or fails on timing.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from sundial_common.runtime.settings import CommonSettings
from sundial_common.security.auth import issue_token
from sundial_common.stores.schema import upgrade
from sundial_infra.process import wait_for
from sundial_infra.servers.postgres import PostgresServer
from sundial_infra.stack import BENCH_PORTS, LocalStack, Ports
from sundial_infra.supervisor import ProcessSpec, Supervisor, sundial_argv
from sundial_worker.consumer import consumer_group

from bench import api_burst, figures, leftover, machine, postgres_costs, profiling, registration, transports
from bench.registration import POOL
from bench.results import REPO, RESULTS, SCRATCH

#: The stack's data directory when a workload names none (deleted and made anew at every start).
STACK_ROOT = SCRATCH / "stack"
#: Where ``--profile`` writes py-spy's collapsed stacks when it names no directory.
PROFILES = SCRATCH / "profiles"
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
#: Transactions ended (committed or rolled back) in the bench's database so far.
TRANSACTIONS = """SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"""
#: Statements executed since pg_stat_statements was reset (the harness's own progress polls among them).
STATEMENT_CALLS = "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
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
    #: ``direct`` (workers read Kafka and Postgres themselves) or ``gateway`` (each worker runs the same handlers
    #: through a worker gateway of its own, holding only a pool token; the gateways' CPU counts with the workers'),
    #: or ``http`` (the pool's delivery is ``http``: delivery workers POST each execution to a local receiver that
    #: answers 200 at once, bench/target_receiver.py).
    worker_transport: str = "direct"


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
        if shape.worker_transport == "http":
            env["SUNDIAL_DELIVERY_ALLOWED_NETWORKS"] = '["127.0.0.1/32"]'  # the receiver, and nothing else
        self.env = env
        processes = [
            ProcessSpec("api", sundial_argv("api", "--host", "127.0.0.1", "--port", str(ports.api))),
            ProcessSpec("hydrator", sundial_argv("hydrator")),
            ProcessSpec("sweeper", sundial_argv("sweeper")),
            *(ProcessSpec(f"dispatcher-{i}", sundial_argv("dispatcher")) for i in range(shape.dispatchers)),
            *transports.worker_processes(self.shape.worker_transport, self.shape.workers, self.ports),
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

    @property
    def gateways(self) -> list[str]:
        return transports.gateway_urls(self.shape.worker_transport, self.shape.workers, self.ports)

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
        if self.shape.worker_transport == "gateway":
            self.stack.postgres.psql(
                "INSERT INTO pool_tokens (id, pool, tenant, subject, created_by, ttl_sec)"
                f" VALUES ('{transports.POOL_TOKEN_ID}', '{POOL}', 'bench-api', 'bench', 'bench', 86400)",
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
        if self.shape.worker_transport == "http":
            transports.set_http_target(self.stack.postgres, self.ports, self.token)
        for url in self.gateways:
            if not wait_for(functools.partial(_ok, f"{url}/healthz"), timeout=60):
                raise RuntimeError(f"bench gateway {url} not ready; see {self.supervisor.log_file('gateway-0')}")
        ready = "serving pool" if self.gateways else "partitions assigned"
        for i in range(self.shape.workers):
            log = self.supervisor.log_file(f"worker-{i}")
            if not wait_for(functools.partial(log_mentions, log, ready), timeout=60):
                raise RuntimeError(f"worker-{i} never logged {ready!r}; see {log}")

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
        """Postgres's processes' ticks so far and who each works for
        (:func:`bench.figures.postgres_ticks_by_client`): the supervised processes and this bench (``harness``: its
        progress poll)."""
        postgres = next((pid for server, pid in self.stack.status() if isinstance(server, PostgresServer) and pid), 0)
        clients = {s.name: s.pid for s in self.supervisor.status() if s.pid}
        return figures.postgres_ticks_by_client(postgres, {**clients, "harness": os.getpid()}) if postgres else {}

    # --- workloads ---------------------------------------------------------------------------

    async def insert_jobs(
        self,
        tenant: str,
        due: Sequence[datetime],
        *,
        handler: str = "echo",
        payload: dict[str, Any] | None = None,
        priority: str = "NORMAL",
    ) -> float:
        """COPY one-shot jobs due at ``due`` into this stack (:func:`bench.registration.insert_jobs`); returns the
        seconds taken."""
        return await registration.insert_jobs(
            self.stack,
            self.root,
            self.shape.shards,
            tenant,
            due,
            handler=handler,
            payload=payload,
            priority=priority,
        )

    async def run_dispatch(
        self, workload: str, due: list[datetime], settle_sec: float = 75.0, create: str = "copy"
    ) -> dict[str, Any]:
        if create == "api":  # as a user would: POST /v1/jobs:batch (bench/api_burst.py)
            tenant = api_burst.TENANT
            insert_s = await api_burst.create_jobs(f"http://127.0.0.1:{self.ports.api}", self.token, POOL, due)
        else:
            # Through gateways, the workers' pool token takes one tenant's work: the run's jobs are that tenant's
            # (the stack is fresh for every run, so its counts are still this run's alone).
            # An HTTP pool's target is its owner's: its executions are that tenant's too.
            owned = self.gateways or self.shape.worker_transport == "http"
            tenant = "bench-api" if owned else f"bench-{workload}-{uuid.uuid4().hex[:6]}"
            insert_s = await self.insert_jobs(tenant, due)
        inserted_at = datetime.now(UTC)
        # CPU and statements count from here: registering the jobs is not what the workload measures.
        cpu_before = self.cpu()
        postgres_before = self.postgres_ticks()
        conn = await asyncpg.connect(self.stack.postgres_dsn)
        await conn.execute("SELECT pg_stat_statements_reset()")
        wal_before = await conn.fetchval("SELECT pg_current_wal_lsn()")
        xacts_before = await conn.fetchval(TRANSACTIONS)
        writes_before = await postgres_costs.table_writes(conn)
        busy_before, window_start = machine.busy_seconds(), time.monotonic()
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
            busy_after, window_s = machine.busy_seconds(), time.monotonic() - window_start
            transactions = await conn.fetchval(TRANSACTIONS) - xacts_before
            calls = await conn.fetchval(STATEMENT_CALLS)
            # Something left: where it was (bench/leftover.py), read while the stack still runs.
            left_behind: dict[str, Any] | None = None
            if done < len(due):
                try:
                    left_behind = await leftover.describe(
                        conn, tenant, self.stack.kafka_bootstrap, POOL, consumer_group(POOL)
                    )
                except Exception as exc:  # a diagnosis that fails must not cost the run's line
                    left_behind = {"error": repr(exc)}
            statements = await figures.top_statements(conn)
            # Every statement by name, with its blocks and WAL, and the rows each table took: load-independent.
            statement_costs = await postgres_costs.statement_costs(conn)
            table_writes = postgres_costs.since(writes_before, await postgres_costs.table_writes(conn))
            wal_bytes = await conn.fetchval("SELECT pg_current_wal_lsn() - $1::pg_lsn", wal_before)
            # The updates of executions since the stack started, and how many were heap-only (no index entry
            # written; migration 0023). An idle backend reports its counts within 10 s: the last may be missing.
            updates = await conn.fetchrow(EXECUTION_UPDATES)
            rows = await conn.fetch(
                """SELECT e.scheduled_for, e.started_at, e.finished_at, e.created_at, e.published_at,
                          (SELECT count(*) FROM execution_attempts a WHERE a.execution_id = e.id) AS starts,
                          (SELECT j.created_at FROM jobs j WHERE j.id = e.job_id) AS job_created_at
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
            "lateness_ms": figures.percentiles(lateness),
            # The same, for the jobs due in the run's first 5 s and for the rest: a slow start (a pool's queue cap
            # still growing, the first passes) shows as a tail of the first phase alone.
            "lateness_by_phase_ms": figures.by_phase(rows, first_due, 5.0),
            # Every execution more than 1 s late, by what made it late (bench.figures.late_causes).
            "late_over_1s_by_cause": figures.late_causes(rows),
            # Where the first start's lateness went: execution row committed, message produced, start CAS done.
            "first_start_ms": figures.first_start(rows),
            # Where every start's lateness went, stage by stage (percentiles of each stage's own duration).
            "stages_ms": figures.stages(rows),
            # How many executions were committed / produced before their due instant (the publish lead, a burst
            # published ahead): that part of the dispatch path was paid before the instant.
            "before_due": figures.before_due(rows),
            "all_started_after_due_s": round((max(r["started_at"] for r in rows) - last_due).total_seconds(), 2)
            if rows
            else None,
            "completion_per_s": round(len(finished) / span) if span else None,
            **machine.cpu_fields(cpu_before, cpu_after),
            # Postgres's CPU by who asked for it: each backend under its client's process, the server's own by name.
            "postgres_by_client": figures.postgres_by_client(postgres_before, postgres_after),
            "postgres_statements": statements,
            # Every statement executed and every transaction ended in the window (the harness's own progress
            # polls among them: one or two a second), and the window itself, with the whole machine's busy CPU.
            "postgres_calls": int(calls or 0),
            "postgres_transactions": int(transactions),
            "window_s": round(window_s, 1),
            "machine_busy_s": round(busy_after - busy_before, 1),
            "postgres_wal_bytes": int(wal_bytes),
            "postgres_statement_costs": statement_costs,
            "table_writes": table_writes,
            "execution_updates": {k: int(v) for k, v in updates.items()},
            "execution_partitions": partitions,
            "execution_index_scans": index_scans,
        }

    def _profile(self, label: str, seconds: float) -> list[subprocess.Popen[bytes]]:
        """py-spy on a dispatcher, a worker and the analytics service for ``seconds`` (collapsed stacks)."""
        if self.profile is None:
            return []
        pids = {s.name: s.pid for s in self.supervisor.status() if s.pid}
        return [
            profiling.record(pids[name], self.profile / f"{label}-{name}.txt", seconds)
            for name in ("dispatcher-0", "worker-0", "analytics")
            if name in pids
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


def add_own_server_options(parser: argparse.ArgumentParser, name: str) -> None:
    """The options of a bench that starts servers of its own: ``--port-offset`` (ports = the bench ports + this),
    ``--root`` (their data, under ``.sundial/bench-<name>`` unless named) and ``--results``."""
    parser.add_argument("--port-offset", type=int, default=0, help="ports = BENCH_PORTS + this")
    parser.add_argument("--root", type=Path, default=REPO / ".sundial" / f"bench-{name}")
    parser.add_argument("--results", type=Path, default=RESULTS, help="directory of the <workload>.jsonl files")


def own_postgres(root: Path, port_offset: int) -> PostgresServer:
    """A durable Postgres of a bench's own under ``root`` (wiped first) on the bench port + ``port_offset``,
    started and migrated (``sundial migrate``, as an operator would); the caller stops it."""
    shutil.rmtree(root, ignore_errors=True)
    postgres = PostgresServer(root / "postgres", BENCH_PORTS.postgres + port_offset, durable=True)
    postgres.start()
    try:
        env = {**os.environ, "SUNDIAL_DATABASE_URL": postgres.dsn, "SUNDIAL_ENV": "dev"}
        subprocess.run([*sundial_argv("migrate")], env=env, check=True, capture_output=True)
    except BaseException:
        postgres.stop()
        raise
    return postgres


def log_mentions(log: Path, text: str) -> bool:
    """Whether the log file ``log`` exists and holds ``text`` (a process's line saying it is ready)."""
    return log.exists() and text in log.read_text(errors="replace")


def ports_at(offset: int) -> Ports:
    """The bench ports (:data:`sundial_infra.stack.BENCH_PORTS`) moved by ``offset``: a multiple of 100, at most
    1500, so runs on different offsets never meet."""
    return Ports(**{f.name: getattr(BENCH_PORTS, f.name) + offset for f in fields(Ports)})


def whole_ms(instant: datetime) -> datetime:
    """``instant`` cut to whole milliseconds (what the API keeps of a due instant)."""
    return instant.replace(microsecond=instant.microsecond // 1000 * 1000)


def burst(n: int, lead: float, per_s: int) -> list[datetime]:
    """W1's due instants: ``n`` jobs all due at one instant, ``lead`` seconds after the ``per_s`` rate of
    registration has registered them."""
    return [whole_ms(datetime.now(UTC) + timedelta(seconds=lead + n / per_s))] * n


def spread(n: int, duration: float, lead: float) -> list[datetime]:
    """W2's and W3's due instants: ``n`` jobs due uniformly over ``duration`` seconds, the first ``lead`` seconds
    after a COPY of them."""
    start = datetime.now(UTC) + timedelta(seconds=lead + n / 50_000)
    return [whole_ms(start + timedelta(seconds=duration * i / n)) for i in range(n)]
