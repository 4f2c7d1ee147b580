"""Every panel of every dashboard returns data from the real Prometheus scraping the real processes.

The api, hydrator, dispatcher, sweeper and worker run with metrics ports, announced to Prometheus through a
file-SD target file (as ``make up`` does). Every target expression of every panel of every dashboard (``$tenant``
and ``$__rate_interval`` substituted) is evaluated through Prometheus' HTTP query API and must return at least one
series twice: first on a healthy stack where two tenants ran only succeeding jobs — no failure, retry, dead
letter or missed fire happened, so those panels say 0 rather than nothing — then after a load with every fault
(succeeding, failing, retried, dead and cancelled executions, and a recurring job that misses fires while
paused), where tenant A's rendered dashboard must read only tenant A's series. A panel added later without data
fails here.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from typing import Any

import httpx
import pytest
from sundial_infra.dashboards import DASHBOARDS, TENANT_DASHBOARD, build, targets
from sundial_infra.servers.prometheus import PrometheusServer, ScrapeTarget, write_targets

from tests.support.processes import Processes, free_port
from tests.support.tenants import tenant_token

FAST = {
    "SUNDIAL_SWEEPER_INTERVAL_SEC": "0.5",
    "SUNDIAL_SWEEPER_GAUGES_INTERVAL_SEC": "1",
    "SUNDIAL_WORKER_HEARTBEAT_INTERVAL_SEC": "0.5",
    "SUNDIAL_WORKER_HEARTBEAT_TTL_SEC": "3",
}
QUICK = {"backoff": "FIXED", "initialDelayMs": 300, "maxDelayMs": 300, "jitter": False}
RATE_INTERVAL = "1m"
# A selector with matchers: metric{...}. Every one in a tenant's fixed dashboard must name that tenant.
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")


def substitute(expr: str, tenant: str) -> str:
    return expr.replace("$__rate_interval", RATE_INTERVAL).replace("$tenant", tenant)


def query(prometheus: PrometheusServer, expr: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{prometheus.url}/api/v1/query", params={"query": expr}, timeout=10)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def loaded_rules(prometheus: PrometheusServer) -> dict[str, dict[str, Any]]:
    groups = httpx.get(f"{prometheus.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    return {rule["name"]: rule for group in groups for rule in group["rules"]}


def every_panel_query(tenant: str) -> list[tuple[str, str]]:
    """(dashboard / panel, PromQL) of every target of the four dashboards and of the tenant's fixed copy."""
    out = []
    for spec in (*DASHBOARDS, TENANT_DASHBOARD.for_tenant(tenant)):
        model = build(spec)
        out += [(f"{model['title']} / {title}", substitute(expr, tenant)) for title, expr in targets(model)]
    return out


async def panels_without_data(
    prometheus: PrometheusServer, tenant: str, when: str, since: float, within: float = 60.0
) -> list[tuple[str, str]]:
    """The panel queries still without a series after waiting up to ``within`` seconds for them (scrapes every
    second, the sweeper's gauges every second; a rate needs two samples in its window), printed with how many had
    data."""
    panels = every_panel_query(tenant)
    deadline = time.monotonic() + within
    while True:
        empty = [(where, expr) for where, expr in panels if not query(prometheus, expr)]
        if not empty or time.monotonic() > deadline:
            break
        await asyncio.sleep(1)
    print(
        f"\n{when}: {len(panels) - len(empty)}/{len(panels)} panel queries returned series "
        f"(data in {time.monotonic() - since:.1f}s)"
    )
    for where, expr in empty:
        print(f"  no data: {where}: {expr}")
    return empty


@pytest.mark.e2e
async def test_every_panel_of_every_dashboard_has_data_and_a_tenant_sees_only_its_own(
    processes: Processes, prometheus: PrometheusServer
) -> None:
    api_port = free_port()
    scrape = [ScrapeTarget("api", "api", f"127.0.0.1:{api_port}")]
    processes.start("api", "api", "--host", "127.0.0.1", "--port", str(api_port), env={"SUNDIAL_INSTANCE_ID": "api"})
    for name, argv in (
        ("hydrator", ("hydrator",)),
        ("dispatcher", ("dispatcher",)),
        ("sweeper", ("sweeper",)),
        ("worker", ("worker", "--app", "sundial_worker.demo:worker", "--concurrency", "8")),
    ):
        port = free_port()
        env = {**FAST, "SUNDIAL_METRICS_PORT": str(port), "SUNDIAL_INSTANCE_ID": name}
        processes.start(name, *argv, env=env)
        scrape.append(ScrapeTarget(name, name, f"127.0.0.1:{port}"))
    write_targets(prometheus.targets_dir / "proof.json", scrape)
    processes.wait_http_ok("api", f"http://127.0.0.1:{api_port}/readyz")
    processes.wait_for_log("dispatcher", "leading with fence token")
    processes.wait_for_log("worker", "partitions assigned")

    run = uuid.uuid4().hex[:6]
    tenant_a, tenant_b = f"proof-a-{run}", f"proof-b-{run}"

    async def load(client: httpx.AsyncClient) -> None:
        async def create(handler: str, payload: dict[str, Any], attempts: int, **extra: Any) -> str:
            body = {
                "name": handler,
                "type": "DELAYED",
                "delaySeconds": 0,
                "target": {"pool": "demo", "handler": handler},
                "payload": payload,
                "retryPolicy": {"maxAttempts": attempts, **QUICK},
                **extra,
            }
            response = await client.post("/v1/jobs", json=body)
            assert response.status_code == 201, response.text
            return str(response.json()["jobId"])

        async def execution(job_id: str, state: str, within: float = 30.0) -> str:
            deadline = time.monotonic() + within
            while time.monotonic() < deadline:
                job = (await client.get(f"/v1/jobs/{job_id}")).json()
                if job["latestExecutions"] and job["latestExecutions"][0]["state"] == state:
                    return str(job["latestExecutions"][0]["executionId"])
                await asyncio.sleep(0.2)
            raise AssertionError(f"job {job_id} has no {state} execution within {within}s: {job}")

        echoes = [await create("echo", {"n": i}, 1) for i in range(3)]
        flaky = await create("flaky", {"failures": 1}, 2)
        failing = await create("fail", {}, 2)
        sleeper = await create("sleep", {"seconds": 60}, 1)
        recurring = await client.post(
            "/v1/jobs",
            json={
                "name": "every-second",
                "type": "INTERVAL",
                "intervalSec": 1,
                "catchupWindowSec": 1,
                "target": {"pool": "demo", "handler": "echo"},
            },
        )
        assert recurring.status_code == 201, recurring.text
        recurring_id = recurring.json()["jobId"]
        for job_id in echoes:
            await execution(job_id, "SUCCEEDED")
        await execution(flaky, "SUCCEEDED")
        await execution(failing, "DEAD")
        running = await execution(sleeper, "RUNNING")
        assert (await client.post(f"/v1/executions/{running}/cancel")).status_code == 202
        await execution(sleeper, "CANCELLED")
        # Paused past its catch-up window, the recurring job misses fires; resumed, it runs one for them all.
        assert (await client.post(f"/v1/jobs/{recurring_id}/pause")).status_code == 200
        await asyncio.sleep(3.5)
        assert (await client.post(f"/v1/jobs/{recurring_id}/resume")).status_code == 200

    async def succeeding_only(client: httpx.AsyncClient) -> None:
        """Only jobs that succeed: nothing fails, retries, dies or is missed."""
        ids = []
        for i in range(3):
            body = {"name": "echo", "type": "DELAYED", "delaySeconds": 0, "target": {"pool": "demo", "handler": "echo"}}
            response = await client.post("/v1/jobs", json={**body, "payload": {"n": i}})
            assert response.status_code == 201, response.text
            ids.append(response.json()["jobId"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            jobs = [(await client.get(f"/v1/jobs/{job_id}")).json() for job_id in ids]
            if all(j["latestExecutions"] and j["latestExecutions"][0]["state"] == "SUCCEEDED" for j in jobs):
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"the echo jobs did not succeed within 30 s: {jobs}")

    base = f"http://127.0.0.1:{api_port}"
    token_a, token_b = (
        tenant_token(processes.env["SUNDIAL_DATABASE_URL"], t, pools=["demo"]) for t in (tenant_a, tenant_b)
    )
    async with (
        httpx.AsyncClient(
            base_url=base,
            headers={"Authorization": f"Bearer {token_a}"},
        ) as a,
        httpx.AsyncClient(
            base_url=base,
            headers={"Authorization": f"Bearer {token_b}"},
        ) as b,
    ):
        await asyncio.gather(succeeding_only(a), succeeding_only(b))
        empty = await panels_without_data(prometheus, tenant_a, "on a healthy stack", time.monotonic())
        assert not empty, f"healthy stack: {len(empty)} panel queries returned no series: " + "; ".join(
            where for where, _ in empty
        )
        await asyncio.gather(load(a), load(b))

    loaded = time.monotonic()
    empty = await panels_without_data(prometheus, tenant_a, "after the fault load", loaded)
    assert not empty, f"{len(empty)} panel queries returned no series: " + "; ".join(where for where, _ in empty)

    # Tenant A's own dashboard: every selector names tenant A, and reads A's series only, while B has its own.
    fixed = build(TENANT_DASHBOARD.for_tenant(tenant_a))
    for title, expr in targets(fixed):
        selectors = SELECTOR.findall(substitute(expr, tenant_a))
        assert selectors, f"{title}: {expr} has no selector"
        for metric, matchers in selectors:
            assert f'tenant="{tenant_a}"' in matchers, f"{title}: {metric}{{{matchers}}} does not fix the tenant"
            series = query(prometheus, f"{metric}{{{matchers}}}")
            assert series and {s["metric"].get("tenant") for s in series} == {tenant_a}, (title, metric)
            other = query(prometheus, f"{metric}{{{matchers.replace(tenant_a, tenant_b)}}}")
            assert other, f"{metric}: tenant B has no series, so the filter proves nothing"
        for one in query(prometheus, substitute(expr, tenant_a)):
            assert one["metric"].get("tenant") in (None, tenant_a), (title, one)

    # The alerts read the real series: on this healthy stack every shard has a leader, every process reports.
    rules = loaded_rules(prometheus)
    assert {"SundialShardWithoutLeader", "SundialProcessDown", "SundialDispatchLatenessSLO"} <= rules.keys()
    for healthy in ("SundialShardWithoutLeader", "SundialProcessDown"):
        assert rules[healthy]["health"] == "ok" and query(prometheus, rules[healthy]["query"]) == [], healthy
    assert query(prometheus, "shard:sundial_shard_leader:max == 1"), "the recording rule sees the leaders"
