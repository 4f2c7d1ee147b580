"""History and analytics end to end: real api, dispatcher, hydrator, worker and analytics processes (embedded chDB).

Two tenants' jobs succeed, fail, and are retried into DEAD while the analytics service is killed twice — once
by ``SUNDIAL_CRASH_POINT=analytics.after_insert`` (between its ClickHouse insert and its outbox delete, the
worst moment: the batch is sent again) and once by ``kill -9`` mid-stream. After quiescence the replica's
executions per tenant × state × day equal Postgres' exactly, and ``/v1/stats`` answers from it.

There is no broker between Postgres and ClickHouse (the outbox is read directly), so a broker restart cannot
touch this path; the test does not restart one.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.support.processes import Processes, free_port
from tests.support.tenants import tenant_token

TENANTS = ("alpha", "beta")
#: Per tenant: (handler, jobs, maxAttempts).
WORK = (("echo", 60, 1), ("fail", 20, 1), ("flaky", 20, 2))


async def postgres_counts(conn: asyncpg.Connection) -> Counter[tuple[str, str, str]]:
    rows = await conn.fetch(
        "SELECT tenant_id, state, (scheduled_for AT TIME ZONE 'UTC')::date AS day, count(*) AS n FROM executions"
        " GROUP BY 1, 2, 3"
    )
    return Counter({(r["tenant_id"], r["state"], r["day"].isoformat()): r["n"] for r in rows})


def replica_counts(url: str) -> Counter[tuple[str, str, str]]:
    return Counter({(t, s, d): n for t, s, d, n in httpx.get(f"{url}/counts", timeout=10).json()})


@pytest.mark.e2e
async def test_the_replica_converges_to_postgres_after_the_ingester_is_killed_twice(
    processes: Processes, database_url: str, tmp_path: Path
) -> None:
    api_port, stats_port = free_port(), free_port()
    stats_url = f"http://127.0.0.1:{stats_port}"
    analytics_env = {
        "SUNDIAL_ANALYTICS_CHDB_PATH": str(tmp_path / "chdb"),
        "SUNDIAL_ANALYTICS_PORT": str(stats_port),
        # Small batches: the kills land mid-stream, with events on both sides of them.
        "SUNDIAL_ANALYTICS_BATCH_SIZE": "25",
        # A dead incarnation's singleton lease expires sooner: its successor takes over within 2 s.
        "SUNDIAL_LEASE_TTL_SEC": "2",
        "SUNDIAL_LEASE_MARGIN_SEC": "0.5",
    }
    processes.start("api", "api", "--port", str(api_port), env={"SUNDIAL_ANALYTICS_URL": stats_url})
    processes.start("hydrator", "hydrator")
    processes.start("dispatcher", "dispatcher")
    processes.start("worker", "worker", "--app", "sundial_worker.demo:worker", "--concurrency", "32")
    processes.start("analytics-1", "analytics", env={**analytics_env, "SUNDIAL_CRASH_POINT": "analytics.after_insert"})
    processes.wait_http_ok("api", f"http://127.0.0.1:{api_port}/readyz")
    processes.wait_for_log("worker", "partitions assigned")

    due = (datetime.now(UTC) + timedelta(seconds=2)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    for tenant in TENANTS:
        headers = {"Authorization": f"Bearer {tenant_token(database_url, tenant, pools=('demo',))}"}
        jobs = [
            {
                "name": f"{handler}-{i}",
                "type": "ONE_SHOT",
                "runAt": due,
                "target": {"pool": "demo", "handler": handler},
                "payload": {"failures": 1},
                "retryPolicy": {"maxAttempts": attempts, "backoff": "FIXED", "initialDelayMs": 500, "jitter": False},
            }
            for handler, count, attempts in WORK
            for i in range(count)
        ]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}", headers=headers, timeout=30) as api:
            answer = await api.post("/v1/jobs:batch", json={"jobs": jobs})
            assert answer.status_code in (200, 207), answer.text

    # The first incarnation dies between a ClickHouse insert and its outbox delete.
    try:
        returncode = await asyncio.to_thread(processes.running["analytics-1"].wait, 60)
    except subprocess.TimeoutExpired:
        returncode = None
    assert returncode == 137, processes.log("analytics-1")[-2000:]
    processes.stop("analytics-1")
    # The second is kill -9ed as soon as it has ingested something (its standby lease must expire first).
    processes.start("analytics-2", "analytics", env=analytics_env)
    processes.wait_for_log("analytics-2", "analytics active", timeout=60)
    processes.stop("analytics-2", signal.SIGKILL)
    processes.start("analytics-3", "analytics", env=analytics_env)
    processes.wait_http_ok("analytics-3", f"{stats_url}/healthz", timeout=60)

    total = len(TENANTS) * sum(count for _handler, count, _attempts in WORK)
    conn = await asyncpg.connect(database_url)
    try:
        # Quiescence: every execution ended in Postgres and the outbox drained.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            ended = await conn.fetchval("SELECT count(*) FROM executions WHERE state NOT IN ('PENDING', 'RUNNING')")
            queued = await conn.fetchval("SELECT count(*) FROM execution_events")
            if ended == total and queued == 0:
                break
            await asyncio.sleep(0.3)
        truth = await postgres_counts(conn)
    finally:
        await conn.close()
    assert sum(truth.values()) == total
    assert {state for _t, state, _d in truth} == {"SUCCEEDED", "DEAD"}
    assert replica_counts(stats_url) == truth

    # The API answers the tenant's history from the replica, scoped to the tenant.
    headers = {"Authorization": f"Bearer {tenant_token(database_url, 'alpha', pools=('demo',))}"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}", headers=headers, timeout=30) as api:
        stats = (await api.get("/v1/stats/executions", params={"interval": "day", "groupBy": "handler"})).json()
        handlers = (await api.get("/v1/stats/handlers")).json()
    by_handler = {item["group"]: item for item in stats["items"]}
    assert {h: by_handler[h]["executions"] for h in by_handler} == {"echo": 60, "fail": 20, "flaky": 20}
    assert by_handler["fail"]["failureRate"] == 1.0
    assert by_handler["flaky"]["failed"] == 0  # retried once, then succeeded
    assert handlers["mostFailing"][0]["handler"] == "fail"
    assert handlers["mostFailing"][0]["topErrorClass"] == "RuntimeError"

    # Freshness: a final state reaches ClickHouse within seconds of its Postgres commit (measured precisely by
    # bench/workloads/analytics.py; here a bound a machine twice as slow keeps).
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}", headers=headers, timeout=30) as api:
        created = await api.post(
            "/v1/jobs",
            json={"name": "fresh", "type": "DELAYED", "delaySeconds": 1, "target": {"pool": "demo", "handler": "echo"}},
        )
        job_id = created.json()["jobId"]
        conn = await asyncpg.connect(database_url)
        try:
            deadline = time.monotonic() + 30
            while not (row := await conn.fetchrow("SELECT id, state FROM executions WHERE job_id = $1", job_id)) or (
                row["state"] != "SUCCEEDED"
            ):
                assert time.monotonic() < deadline, "the fresh job did not succeed within 30 s"
                await asyncio.sleep(0.05)
        finally:
            await conn.close()
        committed = time.monotonic()
        async with httpx.AsyncClient(base_url=stats_url, timeout=10) as replica:
            while (await replica.get(f"/executions/{row['id']}", params={"tenant": "alpha"})).json().get(
                "state"
            ) != "SUCCEEDED":
                assert time.monotonic() - committed < 10, "the final state took more than 10 s to reach ClickHouse"
                await asyncio.sleep(0.05)
