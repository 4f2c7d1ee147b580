"""The retry circuit breaker end to end: a downstream outage with and without the breaker, real processes.

The retry breaker's proof, scaled down so it runs in well under a minute (the full size — 1,000 executions, a 2-minute
outage — is ``bench/workloads/breaker.py``): two tenants share pool ``demo``; each fires 200 executions of the demo
``outage`` handler, which fails every call for ~20 s and then recovers, with ``maxAttempts`` 5 and a 1 s
backoff. Tenant ``on`` has the breaker (the sweeper's window and cool-downs shortened through settings);
tenant ``off`` turned it off through the admin tenants API. Meanwhile ``echo`` jobs of tenant ``on``, same
pool, keep running.

What a user would notice: with the breaker, no retry is dispatched while it is OPEN and at most its probes
while HALF_OPEN; held executions show ``heldBy`` with their failed state and attempt number; after the outage
all 200 succeed, none dead. Without it, the retries storm into the outage and executions go DEAD.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

import asyncpg
import httpx
import pytest

from tests.support.processes import Processes, free_port
from tests.support.tenants import tenant_token

T = TypeVar("T")
N = 200
OUTAGE_SEC = 20.0
PROBES = 3
EDGE = timedelta(milliseconds=250)
FAST = {
    "SUNDIAL_SWEEPER_INTERVAL_SEC": "0.5",
    "SUNDIAL_BREAKER_INTERVAL_SEC": "0.5",
    "SUNDIAL_BREAKER_WINDOW_SEC": "10",
    "SUNDIAL_BREAKER_COOLDOWN_SEC": "4",
    "SUNDIAL_BREAKER_MAX_COOLDOWN_SEC": "8",
    "SUNDIAL_BREAKER_PROBES": str(PROBES),
    "SUNDIAL_BREAKER_RELEASE_SPREAD_SEC": "3",
}
RETRY = {"maxAttempts": 5, "backoff": "FIXED", "initialDelayMs": 1000, "maxDelayMs": 1000, "jitter": False}


def _jobs(until: float) -> list[dict[str, Any]]:
    return [
        {
            "name": f"outage-{i}",
            "type": "DELAYED",
            "delaySeconds": 0,
            "target": {"pool": "demo", "handler": "outage"},
            "payload": {"until": until},
            "retryPolicy": RETRY,
        }
        for i in range(N)
    ]


@pytest.mark.e2e
async def test_breaker_holds_retries_through_an_outage_and_releases_them(processes: Processes) -> None:
    port = free_port()
    processes.start("api", "api", "--host", "127.0.0.1", "--port", str(port))
    for name in ("hydrator", "dispatcher"):
        processes.start(name, name)
    processes.start("sweeper", "sweeper", env=FAST)
    processes.start("worker", "worker", "--app", "sundial_worker.demo:worker", "--concurrency", "32")
    processes.wait_http_ok("api", f"http://127.0.0.1:{port}/readyz")
    processes.wait_for_log("dispatcher", "leading with fence token")
    processes.wait_for_log("sweeper", "sweeper started")
    processes.wait_for_log("worker", "partitions assigned")
    db = processes.env["SUNDIAL_DATABASE_URL"]
    on = tenant_token(db, "breaker-on", pools=("demo",))
    off = tenant_token(db, "breaker-off", pools=("demo",))
    admin = tenant_token(db, "breaker-off", admin=True)
    base = f"http://127.0.0.1:{port}"

    async with (
        httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {on}"}, timeout=30) as a,
        httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {off}"}, timeout=30) as b,
        httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {admin}"}, timeout=30) as ops,
    ):
        # Bad settings are refused naming the field; the tenant then turns its breaker off.
        bad = await ops.patch("/v1/admin/tenants/breaker-off", json={"breaker": {"failureRatio": 1.5}})
        assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "breaker.failureRatio", bad.text
        bad = await ops.patch(
            "/v1/admin/tenants/breaker-off", json={"breaker": {"cooldownSec": 60, "maxCooldownSec": 5}}
        )
        assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "breaker.maxCooldownSec", bad.text
        turned = await ops.patch("/v1/admin/tenants/breaker-off", json={"breaker": {"enabled": False}})
        assert turned.status_code == 200 and turned.json()["breaker"] == {"enabled": False}, turned.text

        until = time.time() + OUTAGE_SEC
        for client in (a, b):
            created = await client.post("/v1/jobs:batch", json={"jobs": _jobs(until)})
            assert created.status_code in (200, 201, 207), created.text

        # The breaker opens, and while it is open the held executions show it.
        breaker = await _until(lambda: _breaker(a, "OPEN", held=True), 30, "tenant on's breaker to open holding work")
        assert breaker["pool"] == "demo" and breaker["handler"] == "outage" and breaker["failureRatio"] >= 0.5

        async def held_view() -> dict[str, Any] | None:
            # Picked in Postgres, read over the API: a probe may take the one picked in between, so pick again.
            held = await _held_execution(db, breaker["id"])
            view: dict[str, Any] = (await a.get(f"/v1/executions/{held}")).json()
            return view if view.get("heldBy") == breaker["id"] else None

        view = await _until(held_view, 15, "an execution held by the breaker")
        assert view["state"] in ("FAILED", "TIMED_OUT") and view["attempt"] < 5 and view["nextAttemptAt"], view

        # Another handler of the same tenant and pool runs normally while the breaker is open.
        echo = await a.post(
            "/v1/jobs",
            json={"name": "echo", "type": "DELAYED", "delaySeconds": 0, "target": {"pool": "demo", "handler": "echo"}},
        )
        assert echo.status_code == 201, echo.text
        await _until(lambda: _job_succeeded(a, echo.json()["jobId"]), 20, "echo to succeed while the breaker is open")
        meanwhile = await _breaker(a, None)
        assert meanwhile is not None and meanwhile["state"] in ("OPEN", "HALF_OPEN")
        assert all(x["state"] == "CLOSED" for x in (await b.get("/v1/breakers")).json()["items"])  # off: never opens

        # After the outage: every execution of tenant on succeeds, none dead; the breaker closed.
        await _until(lambda: _all_final(db, "breaker-on"), OUTAGE_SEC + 60, "tenant on's executions to finish")
        await _until(lambda: _all_final(db, "breaker-off"), 60, "tenant off's executions to finish")
        on_states = await _states(db, "breaker-on", "outage")
        off_states = await _states(db, "breaker-off", "outage")
        assert on_states == {"SUCCEEDED": N}, on_states
        closed = await _breaker(a, None)
        assert closed is not None and closed["state"] == "CLOSED" and closed["held"] == 0 and closed["opens"] >= 1

        # While OPEN no retry was dispatched; while HALF_OPEN at most the probes.
        trail = (await a.get(f"/v1/breakers/{closed['id']}/audit")).json()["items"]
        while_open, while_half_open, half_opens = await _retries_by_state(db, closed["id"], trail)
        print(
            f"\nbreaker on: {while_open} retries dispatched while OPEN, {while_half_open} while HALF_OPEN "
            f"({half_opens} half-opens × {PROBES} probes), transitions "
            f"{[e['action'] for e in trail]}; breaker off: {off_states}"
        )
        assert while_open == 0
        assert while_half_open <= half_opens * PROBES
        # Without the breaker the retries went into the outage: a 1 s backoff × 4 retries ends long before it
        # (how many died is printed above; on a slow machine fewer reach their fifth attempt in time).
        assert off_states.get("DEAD", 0) > 0, off_states


async def _until(check: Callable[[], Awaitable[T | None]], within: float, what: str) -> T:
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within}s")
        await asyncio.sleep(0.2)


async def _breaker(client: httpx.AsyncClient, state: str | None, *, held: bool = False) -> dict[str, Any] | None:
    items = [b for b in (await client.get("/v1/breakers")).json()["items"] if b["handler"] == "outage"]
    if not items:
        return None
    b: dict[str, Any] = items[0]
    if state is not None and b["state"] != state:
        return None
    return b if not held or b["held"] > 0 else None


async def _job_succeeded(client: httpx.AsyncClient, job_id: str) -> bool:
    latest = (await client.get(f"/v1/jobs/{job_id}")).json()["latestExecutions"]
    return bool(latest) and latest[0]["state"] == "SUCCEEDED"


async def _held_execution(db: str, breaker_id: str) -> str:
    conn = await asyncpg.connect(db)
    try:
        return str(await conn.fetchval("SELECT id FROM executions WHERE held_by = $1::uuid LIMIT 1", breaker_id))
    finally:
        await conn.close()


async def _states(db: str, tenant: str, handler: str) -> dict[str, int]:
    conn = await asyncpg.connect(db)
    try:
        rows = await conn.fetch(
            "SELECT state, count(*) AS n FROM executions WHERE tenant_id = $1 AND handler = $2 GROUP BY state",
            tenant,
            handler,
        )
        return {r["state"]: r["n"] for r in rows}
    finally:
        await conn.close()


async def _all_final(db: str, tenant: str) -> bool:
    states = await _states(db, tenant, "outage")
    return sum(states.values()) == N and set(states) <= {"SUCCEEDED", "DEAD"}


async def _retries_by_state(db: str, breaker_id: str, trail: list[dict[str, Any]]) -> tuple[int, int, int]:
    """Retries dispatched (audit ``retry`` rows of the handler's executions) while OPEN and while HALF_OPEN."""
    conn = await asyncpg.connect(db)
    try:
        moves = await conn.fetch(
            "SELECT at, to_state FROM audit_log WHERE entity = 'breaker' AND entity_id = $1::uuid ORDER BY id",
            breaker_id,
        )
        retries = await conn.fetch(
            "SELECT a.at FROM audit_log a JOIN executions e ON e.id = a.entity_id"
            " WHERE a.entity = 'execution' AND a.action = 'retry' AND e.tenant_id = 'breaker-on'"
            " AND e.handler = 'outage'"
        )
    finally:
        await conn.close()
    assert len(moves) == len(trail)
    spans = [(m["at"], moves[i + 1]["at"] if i + 1 < len(moves) else None, m["to_state"]) for i, m in enumerate(moves)]
    # Audit times are each transaction's start (now()) while the dispatch transaction reads the breaker a few
    # milliseconds later: a retry stamped within EDGE of a transition may have read the state before or after.
    counts = {"OPEN": 0, "HALF_OPEN": 0, "CLOSED": 0}
    for r in retries:
        for start, end, state in spans:
            if start + EDGE < r["at"] and (end is None or r["at"] < end - EDGE):
                counts[state] += 1
    return counts["OPEN"], counts["HALF_OPEN"], sum(1 for m in moves if m["to_state"] == "HALF_OPEN")
