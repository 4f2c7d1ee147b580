"""The bench's ``create`` workload: how fast ONE API process registers jobs, driven by ``wrk``.

A Python load generator saturates before the API does (the old httpx loop used more CPU than the API it
measured), so the load comes from wrk (Debian package ``wrk``; ``make deps`` installs it) with the Lua script
``bench/create.lua``, which writes each request's body (a unique job name per job, a unique
``Idempotency-Key`` per request when keyed) and sends the tenant's bearer token. Each load runs for a fixed time
after a short warm-up, on a stack of their own (Postgres, Redis, the API, a hydrator and a sweeper: no dispatcher
or worker competes for the two cores; the jobs are due in a day, so none would fire anyway).

One JSON line per load, ``"created"`` saying how the jobs were created (``API single``, ``API batch``): requests
and jobs per second, wrk's latency percentiles, CPU seconds of every process (the API's and Postgres' per job
too: less sensitive to a shared machine than the rates), the jobs and audit rows actually written, the
Postgres statements per job and the top statements (``pg_stat_statements``), and the load average before and
after. ``--profile DIR`` records a py-spy profile (collapsed stacks) of the API during each load.

Run it alone with ``python -m bench create`` (``--create-loads single,batch``, ``--create-delay``; see
``python -m bench --help``), or with the other workloads of :mod:`bench.suite`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg

from bench import machine, profiling
from bench.harness import Bench

SCRIPT = Path(__file__).with_name("create.lua")
POOL = "demo"
TENANT = "bench-api"  # registered (and admitted to POOL) by the harness' `migrate --tenant … --pool …`
WARMUP_SEC = 2.0
#: wrk's error counts (status: answers >= 400).
ERRORS = ("connect_errors", "read_errors", "write_errors", "status_errors", "timeouts")


@dataclasses.dataclass(frozen=True)
class Load:
    """One wrk run: ``connections`` clients sending single creates or batches of ``batch_size`` jobs."""

    created: str  # "API single" / "API batch": how the line's jobs were created
    connections: int
    batch_size: int = 1
    idempotency_key: bool = False

    @property
    def mode(self) -> str:
        return "batch" if self.created == "API batch" else "single"


LOADS = {
    "single": Load("API single", connections=32),
    "keyed": Load("API single", connections=32, idempotency_key=True),
    "batch": Load("API batch", connections=4, batch_size=500),
}


#: The keys of a line that say how it was run (its settings, :mod:`bench.results`), not what it measured.
SETTINGS = ("created", "idempotency_key", "connections", "batch_size", "delay_s")


async def measure(
    bench: Bench,
    duration: float,
    loads: Sequence[str] = ("single", "keyed", "batch"),
    delay_sec: int = 86400,
) -> list[dict[str, Any]]:
    """Run the loads one after the other on a fresh stack shaped like ``bench`` without dispatchers, workers or
    analytics (the jobs of one load are a few seconds' worth of rows for the next: no measurable difference)."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError("wrk is not installed: `make deps` installs it (Debian package wrk)")
    shape = dataclasses.replace(bench.shape, dispatchers=0, workers=0, analytics=False)
    stack = Bench(shape, bench.root, bench.ports, bench.profile)
    stack.start()
    try:
        return [await _run(stack, wrk, LOADS[name], duration, delay_sec) for name in loads]
    finally:
        stack.stop()


async def _run(bench: Bench, wrk: str, load: Load, duration: float, delay_sec: int) -> dict[str, Any]:
    url = f"http://127.0.0.1:{bench.ports.api}"
    run = uuid.uuid4().hex[:8]
    # Connections opened, caches filled, the first plans made: not what the line measures.
    await asyncio.to_thread(_wrk, wrk, url, bench.token, load, WARMUP_SEC, delay_sec, f"warm-{run}")
    conn = await asyncpg.connect(bench.stack.postgres_dsn)
    try:
        await conn.execute("SELECT pg_stat_statements_reset()")
        load_before = os.getloadavg()
        cpu_before = bench.cpu()
        profiler = _profile(bench, load, duration)
        result, wrk_cpu = await asyncio.to_thread(_wrk, wrk, url, bench.token, load, duration, delay_sec, run)
        cpu_after = bench.cpu()
        load_after = os.getloadavg()
        if profiler is not None:
            profiler.wait()
        # Requests wrk abandoned at its deadline may still be committing: count once the number stops moving.
        written = await _count_jobs(conn, run)
        for _ in range(30):
            await asyncio.sleep(1.0)
            if written == (written := await _count_jobs(conn, run)):
                break
        audited = await conn.fetchval(
            """SELECT count(*) FROM audit_log a JOIN jobs j ON j.id = a.entity_id
               WHERE a.action = 'create' AND j.tenant_id = $1 AND j.name LIKE $2""",
            TENANT,
            f"{run}-%",
        )
        statements = await conn.fetch(
            """SELECT calls, rows, total_exec_time, left(regexp_replace(query, '\\s+', ' ', 'g'), 90) AS query
               FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%'
               ORDER BY total_exec_time DESC"""
        )
    finally:
        await conn.close()
    seconds = result["duration_us"] / 1e6
    requests = result["requests"]
    jobs = requests * load.batch_size  # answered within the run (a batch's items all 201: see jobs_written)
    cpu_lines = machine.cpu_fields(cpu_before, cpu_after, digits=2)
    cpu = cpu_lines.pop("cpu_s")
    cpu["wrk"] = round(wrk_cpu, 2)
    return {
        "workload": "create",
        "created": load.created,
        "idempotency_key": load.idempotency_key,
        "connections": load.connections,
        "batch_size": load.batch_size,
        "delay_s": delay_sec,
        "duration_s": round(seconds, 1),
        "requests": requests,
        "requests_per_s": round(requests / seconds),
        "jobs_per_s": round(jobs / seconds),
        "errors": {k: result[k] for k in ERRORS},
        "latency_ms": {k: round(v / 1000, 1) for k, v in result["latency_us"].items()},
        # In-flight requests wrk abandons at its deadline may still commit: written ≥ answered.
        "jobs_written": written,
        "audit_rows": audited,
        "cpu_s": cpu,
        **cpu_lines,
        "api_cores": round(cpu.get("api", 0) / seconds, 2),
        "postgres_cores": round(cpu.get("postgres", 0) / seconds, 2),
        "api_cpu_ms_per_job": round(1000 * cpu.get("api", 0) / max(1, written), 3),
        "postgres_cpu_ms_per_job": round(1000 * cpu.get("postgres", 0) / max(1, written), 3),
        "statements_per_job": round(sum(r["calls"] for r in statements) / max(1, written), 2),
        "postgres_statements": [
            {"query": r["query"], "calls": r["calls"], "rows": r["rows"], "total_ms": round(r["total_exec_time"])}
            for r in statements[:8]
        ],
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
    }


async def _count_jobs(conn: asyncpg.Connection, run: str) -> int:
    return int(
        await conn.fetchval("SELECT count(*) FROM jobs WHERE tenant_id = $1 AND name LIKE $2", TENANT, f"{run}-%")
    )


def _wrk(
    wrk: str, url: str, token: str, load: Load, seconds: float, delay_sec: int, run: str
) -> tuple[dict[str, Any], float]:
    """Run wrk once: its summary (``WRK_RESULT`` line of create.lua) and the CPU seconds wrk itself used."""
    argv = [
        wrk,
        *("-t", str(min(2, load.connections)), "-c", str(load.connections), "-d", f"{max(1, round(seconds))}s"),
        *("--timeout", "30s", "-s", str(SCRIPT), url, "--"),
        *(token, load.mode, str(load.batch_size), "keyed" if load.idempotency_key else "plain"),
        *(POOL, str(delay_sec), run),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.read(), proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    for line in out.decode().splitlines():
        if line.startswith("WRK_RESULT "):
            return json.loads(line.removeprefix("WRK_RESULT ")), usage.ru_utime + usage.ru_stime
    raise RuntimeError(f"wrk printed no result (exit {proc.returncode}): {err.decode()[-2000:]} {out.decode()[-2000:]}")


def _profile(bench: Bench, load: Load, seconds: float) -> subprocess.Popen[bytes] | None:
    """py-spy on the API for the measured run (collapsed stacks), when the bench records profiles."""
    if bench.profile is None:
        return None
    (api,) = (s.pid for s in bench.supervisor.status() if s.name == "api")
    assert api is not None, "the API is not running"
    label = f"create-{load.mode}{'-keyed' if load.idempotency_key else ''}-api.txt"
    return profiling.record(api, bench.profile / label, seconds)
