"""Weighted fair dispatch with the real processes: a tenant's burst does not make another tenant wait.

Tenant ``burst`` registers 3,000 one-shot jobs due at one instant, then tenant ``urgent`` 100 due at the same
instant (created last, so by due time and id they are the very last in the hot window). Every ``urgent`` job
must start before half of the burst has: the dispatcher serves tenants round-robin and keeps the pool's
Kafka queue short, so nothing of ``urgent``'s waits behind ``burst``'s backlog. Then two tenants of equal
weight, both saturated, must get about half of the dispatch each. The issue's 50,000-job scenario runs in
``bench/workloads/fairness.py`` (100,000 + 1,000, beside the same run with fairness off); this one keeps the e2e lane
short. Lateness figures are printed (measurements, not assertions).
"""

from __future__ import annotations

import asyncio
import statistics
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from tests.support.processes import Processes, free_port
from tests.support.tenants import tenant_token

BURST = 3000  # ten times the pool queue cap below: most of it waits in the dispatcher
URGENT = 100
SATURATED = 1000


async def register(client: httpx.AsyncClient, token: str, n: int, run_at: datetime, name: str) -> None:
    body = {
        "name": name,
        "type": "ONE_SHOT",
        "runAt": run_at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "target": {"pool": "demo", "handler": "echo"},
    }
    for start in range(0, n, 1000):
        batch = [body] * min(1000, n - start)
        answer = await client.post("/v1/jobs:batch", json={"jobs": batch}, headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 200 and answer.json()["created"] == len(batch), answer.text[:500]


async def starts(conn: asyncpg.Connection, tenant: str) -> list[Any]:
    return list(
        await conn.fetch(
            "SELECT scheduled_for, started_at FROM executions WHERE tenant_id = $1 AND started_at IS NOT NULL"
            " ORDER BY started_at",
            tenant,
        )
    )


async def wait_started(conn: asyncpg.Connection, tenants: dict[str, int], within: float) -> None:
    deadline = datetime.now(UTC) + timedelta(seconds=within)
    while True:
        counts = {t: len(await starts(conn, t)) for t in tenants}
        if all(counts[t] >= n for t, n in tenants.items()):
            return
        assert datetime.now(UTC) < deadline, f"started so far: {counts} of {tenants}"
        await asyncio.sleep(0.5)  # polling Postgres for progress; there is no event to wait on


@pytest.mark.e2e
async def test_a_burst_does_not_delay_another_tenant_and_equal_weights_share_dispatch(
    processes: Processes, database_url: str
) -> None:
    port = free_port()
    fair = {"SUNDIAL_DISPATCHER_POOL_QUEUE_CAP": "300"}  # fairness itself is on by default
    processes.start("api", "api", "--host", "127.0.0.1", "--port", str(port))
    processes.start("hydrator", "hydrator")
    processes.start("dispatcher", "dispatcher", env=fair)
    processes.start("worker", "worker", "--app", "sundial_worker.demo:worker", "--concurrency", "64")
    processes.wait_http_ok("api", f"http://127.0.0.1:{port}/readyz")
    processes.wait_for_log("dispatcher", "leading with fence token")
    processes.wait_for_log("worker", "partitions assigned")
    burst, urgent = (
        tenant_token(database_url, "burst", pools=("demo",)),
        tenant_token(database_url, "urgent", pools=("demo",)),
    )
    left, right = (
        tenant_token(database_url, "left", pools=("demo",)),
        tenant_token(database_url, "right", pools=("demo",)),
    )

    conn = await asyncpg.connect(database_url)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            due = (datetime.now(UTC) + timedelta(seconds=15)).replace(microsecond=0)
            await register(client, burst, BURST, due, "burst")
            await register(client, urgent, URGENT, due, "urgent")
            registered = datetime.now(UTC)
            await wait_started(conn, {"burst": BURST, "urgent": URGENT}, within=180)

            a, b = await starts(conn, "burst"), await starts(conn, "urgent")
            half_of_burst = a[len(a) // 2]["started_at"]
            late_b = [(r["started_at"] - r["scheduled_for"]).total_seconds() for r in b]
            drain = (a[-1]["started_at"] - due).total_seconds()
            print(
                f"\nurgent lateness: P50 {statistics.median(late_b):.2f} s, max {max(late_b):.2f} s "
                f"(registration ended {(registered - due).total_seconds():+.1f} s from due); "
                f"burst of {BURST} drained {drain:.1f} s after due"
            )
            assert b[-1]["started_at"] < half_of_burst, (
                f"the last urgent job started {max(late_b):.1f} s after due, after half the burst had"
            )

            # Equal weights, both saturated: about half of the dispatch each while both have work waiting.
            due = (datetime.now(UTC) + timedelta(seconds=8)).replace(microsecond=0)
            await register(client, left, SATURATED, due, "left")
            await register(client, right, SATURATED, due, "right")
            await wait_started(conn, {"left": SATURATED, "right": SATURATED}, within=120)
        rows = await conn.fetch(
            "SELECT tenant_id FROM executions WHERE tenant_id IN ('left', 'right') ORDER BY id LIMIT $1", SATURATED
        )
        share = sum(1 for r in rows if r["tenant_id"] == "left") / len(rows)
        print(f"left's share of the first {SATURATED} dispatches: {share:.2f}")
        assert 0.4 <= share <= 0.6, share
    finally:
        await conn.close()
