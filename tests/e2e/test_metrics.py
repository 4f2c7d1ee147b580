"""Every process serves its part of the metric catalogue on ``/metrics``: real api, hydrator, dispatcher,
sweeper and worker processes (the background ones on ``--metrics-port``), two tenants, scraped in the
OpenMetrics format Prometheus asks for."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import httpx
import pytest
from prometheus_client.samples import Sample

from tests.support.openmetrics import metric_families
from tests.support.processes import Processes, free_port
from tests.support.tenants import tenant_token

OPENMETRICS = {"Accept": "application/openmetrics-text; version=1.0.0,text/plain;version=0.0.4;q=0.5"}


def scrape(port: int) -> list[Sample]:
    reply = httpx.get(f"http://127.0.0.1:{port}/metrics", headers=OPENMETRICS, timeout=5)
    assert reply.headers["content-type"].startswith("application/openmetrics-text")
    return [s for family in metric_families(reply.text) for s in family.samples]


def series(samples: list[Sample], name: str, **labels: str) -> list[Sample]:
    return [s for s in samples if s.name == name and labels.items() <= s.labels.items()]


@pytest.mark.e2e
async def test_each_process_serves_its_catalogue_series_per_tenant(processes: Processes, database_url: str) -> None:
    ports = {name: free_port() for name in ("api", "hydrator", "dispatcher", "sweeper", "worker")}
    shards = {"SUNDIAL_SHARDS": "2"}
    processes.start("api", "api", "--host", "127.0.0.1", "--port", str(ports["api"]), env=shards)
    processes.start("hydrator", "hydrator", "--metrics-port", str(ports["hydrator"]), env=shards)
    processes.start(
        "sweeper",
        "sweeper",
        "--interval",
        "0.5",
        "--metrics-port",
        str(ports["sweeper"]),
        env={**shards, "SUNDIAL_SWEEPER_GAUGES_INTERVAL_SEC": "1"},
    )
    processes.start(
        "dispatcher",
        "dispatcher",
        "--instance-id",
        "dispatcher-m",
        "--metrics-port",
        str(ports["dispatcher"]),
        env=shards,
    )
    processes.start(
        "worker", "worker", "--app", "sundial_worker.demo:worker", "--metrics-port", str(ports["worker"]), env=shards
    )
    processes.wait_http_ok("api", f"http://127.0.0.1:{ports['api']}/readyz")
    processes.wait_for_log("dispatcher", "leading with fence token")
    processes.wait_for_log("worker", "partitions assigned")

    tag = uuid.uuid4().hex[:6]
    a, b = f"tenant-a-{tag}", f"tenant-b-{tag}"
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports['api']}", timeout=30) as client:
        for tenant, handler in ((a, "echo"), (a, "echo"), (a, "fail"), (b, "echo")):
            created = await client.post(
                "/v1/jobs",
                headers={"Authorization": f"Bearer {tenant_token(database_url, tenant, pools=('demo',))}"},
                json={
                    "name": handler,
                    "type": "DELAYED",
                    "delaySeconds": 1,
                    "target": {"pool": "demo", "handler": handler},
                    "retryPolicy": {"maxAttempts": 1},  # "fail" goes DEAD at once
                },
            )
            assert created.status_code == 201, created.text

    conn = await asyncpg.connect(database_url)
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while await conn.fetchval("SELECT count(*) FROM executions WHERE finished_at IS NOT NULL") < 4:
            assert asyncio.get_running_loop().time() < deadline, processes.log("worker")[-3000:]
            await asyncio.sleep(0.2)
    finally:
        await conn.close()

    api = scrape(ports["api"])
    assert series(api, "sundial_jobs_created_total", tenant=a, type="DELAYED")[0].value == 3
    assert series(api, "sundial_jobs_created_total", tenant=b, type="DELAYED")[0].value == 1
    assert series(api, "sundial_api_requests_total", route="/v1/jobs", method="POST", status="201")

    dispatcher = scrape(ports["dispatcher"])
    assert series(dispatcher, "sundial_executions_dispatched_total", tenant=a, pool="demo")[0].value == 3
    assert series(dispatcher, "sundial_executions_dispatched_total", tenant=b, pool="demo")[0].value == 1
    leading = series(dispatcher, "sundial_shard_leader", replica="dispatcher-m")
    assert sorted((s.labels["shard"], s.value) for s in leading) == [("0", 1.0), ("1", 1.0)]
    assert len(series(dispatcher, "sundial_shard_fence_token")) == 2
    assert series(dispatcher, "sundial_dispatch_batch_size_count")
    assert series(dispatcher, "sundial_dispatch_pass_duration_seconds_count")

    hydrator = scrape(ports["hydrator"])
    assert {s.labels["shard"] for s in series(hydrator, "sundial_hot_window_members")} == {"0", "1"}
    assert {s.labels["shard"] for s in series(hydrator, "sundial_hot_window_oldest_due_age_seconds")} == {"0", "1"}

    worker = scrape(ports["worker"])
    lateness = series(worker, "sundial_dispatch_lateness_seconds_count", tenant=a, pool="demo")
    assert lateness[0].value == 3
    assert any(
        s.exemplar is not None and len(s.exemplar.labels["trace_id"]) == 32
        for s in series(worker, "sundial_dispatch_lateness_seconds_bucket", tenant=a)
    )
    assert series(worker, "sundial_executions_finished_total", tenant=a, pool="demo", state="SUCCEEDED")[0].value == 2
    assert series(worker, "sundial_dead_letters_total", tenant=a, pool="demo")[0].value == 1
    assert not series(worker, "sundial_dead_letters_total", tenant=b)
    assert (
        series(worker, "sundial_execution_duration_seconds_count", tenant=b, pool="demo", handler="echo")[0].value == 1
    )
    deadline = asyncio.get_running_loop().time() + 15  # sampled every 5 s
    while not series(scrape(ports["worker"]), "sundial_consumer_lag_messages", pool="demo"):
        assert asyncio.get_running_loop().time() < deadline, processes.log("worker")[-3000:]
        await asyncio.sleep(0.3)
    assert series(worker, "sundial_dispatch_lateness_seconds_count", tenant=b, pool="demo")[0].value == 1

    # The sweeper samples the job gauges (DELAYED jobs are COMPLETED once fired) and counts recoveries. A sample
    # may come between the jobs' completion and the worker's batched write of the DEAD outcome: wait for one
    # that has the dead letter (a later sample within 30 s).
    deadline = asyncio.get_running_loop().time() + 30
    while not series(sweeper := scrape(ports["sweeper"]), "sundial_jobs", tenant=a, state="COMPLETED") or not any(
        s.value for s in series(sweeper, "sundial_dead_letter_queue_size", tenant=a)
    ):
        assert asyncio.get_running_loop().time() < deadline, processes.log("sweeper")[-3000:]
        await asyncio.sleep(0.3)
    assert series(sweeper, "sundial_jobs", tenant=a, state="COMPLETED")[0].value == 3
    assert series(sweeper, "sundial_jobs", tenant=b, state="COMPLETED")[0].value == 1
    assert series(sweeper, "sundial_dead_letter_queue_size", tenant=a)[0].value == 1  # its "fail" job
    assert series(sweeper, "sundial_dead_letter_queue_size", tenant=b)[0].value == 0
    assert {s.labels["reason"] for s in series(sweeper, "sundial_sweeper_recoveries_total")} >= {
        "worker_lost",
        "timed_out",
        "republished",
    }
