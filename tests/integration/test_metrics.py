"""The metric catalogue recorded by each process kind, on real Postgres, Redis and the broker.

Each test runs one kind's passes (``run_once()``, or the worker runtime serving real messages) for two
tenants and reads what it recorded: from the process registry, or — for the API — from its ``/metrics``
in the OpenMetrics format Prometheus asks for. Tenant and pool names are unique per test, so the counters
the registry keeps across tests do not mix; each series of tenant A counts tenant A's executions only.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from sundial_api.app import create_app
from sundial_api.settings import ApiSettings
from sundial_common.broker.kafka import KafkaPublisher
from sundial_common.domain.ids import new_id
from sundial_common.hotwindow.window import HotWindow
from sundial_common.observability.metrics import REGISTRY, exposition
from sundial_common.runtime.clock import from_ms, to_ms
from sundial_common.stores import Stores
from sundial_common.stores.dispatch import PlannedExecution
from sundial_common.stores.executions import Outcome
from sundial_common.stores.types import Occurrence
from sundial_dispatcher.dispatcher import DispatcherConfig, ShardDispatcher
from sundial_hydrator.hydrator import Hydrator, HydratorConfig
from sundial_sweeper.sweeper import Sweeper, SweeperConfig
from sundial_worker import Context, Worker, WorkerConfig, WorkerRuntime
from sundial_worker.settings import WorkerSettings

from tests.support.openmetrics import metric_families
from tests.support.pools import admit
from tests.support.tenants import tenant_token
from tests.support.worker import JOIN_SEC, wait_until

FAST = WorkerConfig(concurrency=8, heartbeat_interval_sec=0.3, heartbeat_ttl_sec=5.0, commit_interval_sec=0.1)
SECRET = "test-signing-key-for-the-metrics-suite"


def value(name: str, **labels: str) -> float:
    found = REGISTRY.get_sample_value(name, labels)
    return 0.0 if found is None else found


@pytest.fixture
def names(database_url: str) -> tuple[str, str, str]:
    """A pool and two tenants no other test uses; the pool (and `demo`) admit both."""
    tag = uuid.uuid4().hex[:8]
    pool, a, b = f"m-{tag}", f"tenant-a-{tag}", f"tenant-b-{tag}"
    admit(database_url, pool, a, b)
    admit(database_url, "demo", a, b)
    return pool, a, b


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def due_job(
    stores: Stores,
    hot_window: HotWindow,
    tenant: str,
    pool: str,
    handler: str,
    *,
    due: datetime,
    shard: int = 0,
    **extra: Any,
) -> uuid.UUID:
    """A ONE_SHOT job due at ``due`` in ``shard`` and its hot window, as the API stores one."""
    job_id = new_id()
    await stores.jobs.insert_job(
        {
            "id": job_id,
            "tenant_id": tenant,
            "name": handler,
            "type": "ONE_SHOT",
            "run_at": due,
            "pool": pool,
            "handler": handler,
            "payload": {},
            "timeout_sec": 30,
            "shard": shard,
            "next_fire_at": due,
            **extra,
        },
        actor="test",
    )
    await hot_window.add(shard, [Occurrence(job_id, due)])
    return job_id


async def states(stores: Stores, pool: str) -> list[str]:
    rows = await stores.database.pool.fetch("SELECT state FROM executions WHERE pool = $1 ORDER BY state", pool)
    return [row["state"] for row in rows]


async def test_dispatcher_and_worker_record_each_tenants_executions_under_its_own_labels(
    stores: Stores,
    redis: Redis,
    publisher: KafkaPublisher,
    database_url: str,
    redis_url: str,
    kafka_bootstrap: str,
    names: tuple[str, str, str],
) -> None:
    pool, a, b = names
    hot_window = HotWindow(redis)
    now = from_ms(to_ms(datetime.now(UTC)))
    retry_once = {"maxAttempts": 2, "backoff": "FIXED", "initialDelayMs": 60_000, "maxDelayMs": 60_000, "jitter": False}
    for handler in ("echo", "echo", "undeclared"):
        await due_job(stores, hot_window, a, pool, handler, due=now)
    await due_job(stores, hot_window, b, pool, "echo", due=now)
    await due_job(stores, hot_window, b, pool, "boom", due=now, retry_policy=retry_once)

    result = await ShardDispatcher(
        0, 3, "replica-a", stores.dispatch, hot_window, publisher, DispatcherConfig(shards=1)
    ).run_once()
    assert result.dispatched == result.published == 5
    assert value("sundial_executions_dispatched_total", tenant=a, pool=pool) == 3
    assert value("sundial_executions_dispatched_total", tenant=b, pool=pool) == 2

    worker = Worker(pool=pool)

    @worker.handler("echo")
    async def echo(ctx: Context, payload: Any) -> Any:
        return payload

    @worker.handler("boom")
    async def boom(ctx: Context, payload: Any) -> None:
        raise ValueError("downstream said no")

    settings = WorkerSettings(database_url=database_url, redis_url=redis_url, kafka_bootstrap=kafka_bootstrap, shards=1)
    runtime = WorkerRuntime(worker, settings, config=dataclasses.replace(FAST), worker_id="metrics-worker")
    await runtime.start()
    try:

        async def all_ended() -> bool:
            return await states(stores, pool) == ["DEAD", "FAILED", "SUCCEEDED", "SUCCEEDED", "SUCCEEDED"]

        await wait_until(all_ended, "every execution to end", JOIN_SEC + 20)

        async def lag_sampled() -> bool:
            return any(
                s.labels.get("pool") == pool
                for family in REGISTRY.collect()
                if family.name == "sundial_consumer_lag_messages"
                for s in family.samples
            )

        await wait_until(lag_sampled, "the consumer lag to be sampled", 10)
    finally:
        await runtime.stop()

    # Ended attempts: tenant A's two successes and its dead one (a handler this worker does not declare),
    # tenant B's success and its failure, retried (a retry, not a finished execution).
    assert value("sundial_executions_finished_total", tenant=a, pool=pool, state="SUCCEEDED") == 2
    assert value("sundial_executions_finished_total", tenant=a, pool=pool, state="DEAD") == 1
    assert value("sundial_dead_letters_total", tenant=a, pool=pool) == 1
    assert value("sundial_retries_total", tenant=a, pool=pool) == 0
    assert value("sundial_executions_finished_total", tenant=b, pool=pool, state="SUCCEEDED") == 1
    assert value("sundial_executions_finished_total", tenant=b, pool=pool, state="FAILED") == 0
    assert value("sundial_retries_total", tenant=b, pool=pool) == 1
    assert value("sundial_dead_letters_total", tenant=b, pool=pool) == 0
    # Lateness per first attempt, duration per handler run; the undeclared handler is "other".
    assert value("sundial_dispatch_lateness_seconds_count", tenant=a, pool=pool) == 3
    assert value("sundial_dispatch_lateness_seconds_count", tenant=b, pool=pool) == 2
    assert 0 <= value("sundial_dispatch_lateness_seconds_sum", tenant=a, pool=pool) < 3 * 30
    assert value("sundial_execution_duration_seconds_count", tenant=a, pool=pool, handler="echo") == 2
    assert value("sundial_execution_duration_seconds_count", tenant=a, pool=pool, handler="other") == 1
    assert value("sundial_execution_duration_seconds_count", tenant=a, pool=pool, handler="undeclared") == 0
    assert value("sundial_execution_duration_seconds_count", tenant=b, pool=pool, handler="boom") == 1

    # The OpenMetrics exposition carries each slow-or-not dispatch's trace id as an exemplar.
    body, content_type = exposition("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    trace_ids = {
        row["trace_id"]
        for row in await stores.database.pool.fetch("SELECT trace_id FROM executions WHERE tenant_id = $1", a)
    }
    exemplars = {
        s.exemplar.labels["trace_id"]
        for family in metric_families(body.decode())
        if family.name == "sundial_dispatch_lateness_seconds"
        for s in family.samples
        if s.labels.get("tenant") == a and s.exemplar is not None
    }
    assert exemplars and exemplars <= trace_ids


async def test_the_dispatcher_counts_missed_fires_per_tenant(
    stores: Stores, redis: Redis, publisher: KafkaPublisher, names: tuple[str, str, str]
) -> None:
    pool, a, b = names
    hot_window = HotWindow(redis)
    # An every-minute job of tenant A down for ten minutes: FIRE_ONCE runs the last fire, ten are missed.
    first = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)
    await due_job(
        stores,
        hot_window,
        a,
        pool,
        "echo",
        due=first,
        type="CRON",
        schedule="* * * * *",
        timezone="UTC",
        next_nominal_at=first,
        catchup_window_sec=30,
    )
    await due_job(stores, hot_window, b, pool, "echo", due=datetime.now(UTC) - timedelta(seconds=1))

    result = await ShardDispatcher(
        0, 3, "replica-a", stores.dispatch, hot_window, publisher, DispatcherConfig(shards=1)
    ).run_once()

    assert result.missed >= 9
    assert value("sundial_missed_fires_total", tenant=a) == result.missed
    assert value("sundial_missed_fires_total", tenant=b) == 0


async def test_the_hydrator_reports_each_shards_window_and_forgets_it_when_it_stops_leading(
    stores: Stores, redis: Redis, names: tuple[str, str, str]
) -> None:
    pool, a, b = names
    hot_window = HotWindow(redis)
    now = datetime.now(UTC)
    await due_job(stores, hot_window, a, pool, "echo", due=now - timedelta(seconds=30), shard=1)
    await due_job(stores, hot_window, b, pool, "echo", due=now + timedelta(seconds=600), shard=1)
    await due_job(stores, hot_window, b, pool, "echo", due=now + timedelta(seconds=600), shard=0)
    hydrator = Hydrator(stores, hot_window, HydratorConfig(shards=2, hot_window_sec=3600))

    await hydrator.run_once()

    assert value("sundial_hot_window_members", shard="0") == 1
    assert value("sundial_hot_window_members", shard="1") == 2
    assert value("sundial_hot_window_oldest_due_age_seconds", shard="0") == 0  # nothing overdue
    assert 29 <= value("sundial_hot_window_oldest_due_age_seconds", shard="1") < 120

    hydrator.forget_gauges()
    assert REGISTRY.get_sample_value("sundial_hot_window_members", {"shard": "1"}) is None


async def test_the_sweeper_samples_jobs_and_dead_letters_per_tenant_and_counts_its_recoveries(
    stores: Stores, redis: Redis, publisher: KafkaPublisher, names: tuple[str, str, str]
) -> None:
    pool, a, b = names
    hot_window = HotWindow(redis)
    now = from_ms(to_ms(datetime.now(UTC)))
    await due_job(stores, hot_window, a, pool, "echo", due=now)
    await due_job(stores, hot_window, a, pool, "echo", due=now + timedelta(days=1))
    await due_job(stores, hot_window, b, pool, "echo", due=now + timedelta(days=1))
    await ShardDispatcher(0, 3, "replica-a", stores.dispatch, hot_window, publisher, DispatcherConfig()).run_once()
    # Tenant A's dispatched execution runs on a worker that then hangs past its timeout.
    [row] = await stores.database.pool.fetch("SELECT id, attempt FROM executions WHERE tenant_id = $1", a)
    await stores.executions.start_executions("hung-worker", [(row["id"], row["attempt"])])
    await stores.database.pool.execute(
        "UPDATE executions SET started_at = now() - interval '10 minutes' WHERE id = $1", row["id"]
    )
    before = value("sundial_sweeper_recoveries_total", reason="timed_out")
    sweeper = Sweeper(stores, publisher, SweeperConfig(timeout_grace_sec=0), redis=redis)

    result = await sweeper.run_once()

    assert result.timed_out == 1
    assert value("sundial_sweeper_recoveries_total", reason="timed_out") - before == 1
    # One attempt allowed: the timed-out execution is DEAD, a dead letter of tenant A's.
    assert value("sundial_executions_finished_total", tenant=a, pool=pool, state="DEAD") == 1
    assert value("sundial_dead_letters_total", tenant=a, pool=pool) == 1
    # The pass sampled the gauges after ending the attempt (its first pass samples at once).
    assert value("sundial_dead_letter_queue_size", tenant=a) == 1
    assert value("sundial_dead_letter_queue_size", tenant=b) == 0
    assert value("sundial_jobs", tenant=a, state="ACTIVE") == 1
    assert value("sundial_jobs", tenant=a, state="COMPLETED") == 1
    assert value("sundial_jobs", tenant=b, state="ACTIVE") == 1
    assert REGISTRY.get_sample_value("sundial_jobs", {"tenant": b, "state": "COMPLETED"}) is None

    sweeper.forget_gauges()  # it stopped leading: the next leader's samples are the only ones
    assert REGISTRY.get_sample_value("sundial_jobs", {"tenant": a, "state": "ACTIVE"}) is None


async def test_the_api_serves_request_and_job_creation_metrics_in_openmetrics(
    database_url: str, redis_url: str, names: tuple[str, str, str]
) -> None:
    _, a, b = names
    settings = ApiSettings(database_url=database_url, redis_url=redis_url, jwt_secret=SECRET, shards=4)
    app = create_app(settings)
    job = {"name": "m", "type": "DELAYED", "delaySeconds": 60, "target": {"pool": "demo", "handler": "echo"}}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api.test") as client,
    ):
        for tenant in (a, a, b):
            headers = {"Authorization": f"Bearer {tenant_token(database_url, tenant, secret=SECRET)}"}
            created = await client.post("/v1/jobs", json=job, headers=headers)
            assert created.status_code == 201, created.text
        got = await client.get(f"/v1/jobs/{created.json()['jobId']}", headers=headers)
        assert got.status_code == 200
        assert (await client.get("/no/such/path")).status_code == 404
        scraped = await client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        plain = await client.get("/metrics")

    assert scraped.headers["content-type"].startswith("application/openmetrics-text")
    assert plain.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in metric_families(scraped.text)
        for s in family.samples
    }

    def sample(name: str, **labels: str) -> float:
        return samples.get((name, tuple(sorted(labels.items()))), 0.0)

    assert sample("sundial_jobs_created_total", tenant=a, type="DELAYED") == 2
    assert sample("sundial_jobs_created_total", tenant=b, type="DELAYED") == 1
    assert sample("sundial_api_requests_total", route="/v1/jobs", method="POST", status="201") >= 3
    assert sample("sundial_api_requests_total", route="/v1/jobs/{job_id}", method="GET", status="200") >= 1
    assert sample("sundial_api_requests_total", route="unmatched", method="GET", status="404") >= 1
    assert sample("sundial_api_request_duration_seconds_count", route="/v1/jobs", method="POST", status="201") >= 3
    # Route templates only: no job id ever becomes a label value.
    assert not any(created.json()["jobId"] in str(labels) for _, labels in samples)


async def test_outcomes_written_by_hand_count_like_the_workers(stores: Stores, names: tuple[str, str, str]) -> None:
    """finish_attempts returns the tenant and pool the counters are labelled with."""
    pool, a, _ = names
    due = from_ms(to_ms(datetime.now(UTC)))
    job_id = new_id()
    await stores.jobs.insert_job(
        {
            "id": job_id,
            "tenant_id": a,
            "name": "x",
            "type": "ONE_SHOT",
            "run_at": due,
            "pool": pool,
            "handler": "echo",
            "payload": {},
            "timeout_sec": 30,
            "shard": 0,
            "next_fire_at": due,
        },
        actor="test",
    )
    [planned] = await stores.dispatch.dispatch(
        0,
        1,
        "test",
        [Occurrence(job_id, due)],
        lambda rows: [PlannedExecution(new_id(), row, None, None) for row in rows],
    )
    await stores.executions.start_executions("w", [(planned.execution_id, 1)])
    [finished] = await stores.executions.finish_attempts("w", [Outcome(planned.execution_id, 1, "SUCCEEDED")])
    assert (finished.tenant_id, finished.pool, finished.state) == (a, pool, "SUCCEEDED")
