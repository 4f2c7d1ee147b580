"""The worker runtime on real Postgres, Redis and the broker: what a handler's run records, which work it takes
and how it stops.

Work is produced the way the dispatcher produces it (:mod:`tests.support.worker`); each test has a pool of its own
and every wait is a condition polled against a deadline.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from redis.asyncio import Redis
from sundial_common.broker.kafka import KafkaPublisher
from sundial_common.broker.wakeups import WakingPublisher
from sundial_common.stores import Stores
from sundial_worker import Context, Worker
from sundial_worker.consumer import KafkaExecutionConsumer
from sundial_worker.settings import WorkerSettings

from tests.support.pools import admit
from tests.support.sealed import opened_all
from tests.support.worker import (
    TENANT,
    demo_worker,
    dispatch,
    execution,
    pool,
    publish,
    redis,
    serving,
    settings,
    wait_state,
    wait_until,
    worker_process,
)

__all__ = ["pool", "redis", "settings"]  # the fixtures


async def test_echo_succeeds_with_its_result_and_attempt_recorded(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str
) -> None:
    async with serving(demo_worker(pool), settings) as runtime:
        messages = await dispatch(stores, pool, "echo", [{"n": 1}, {"n": 2}, {"n": 3}])
        await publish(publisher, messages)
        rows = [await wait_state(stores, m, "SUCCEEDED") for m in messages]
    assert [row["result"] for row in rows] == [m.payload for m in messages]
    assert sorted(m.payload["n"] for m in messages) == [1, 2, 3]
    for row in rows:
        assert row["worker_id"] == runtime.worker_id
        assert row["error"] is None
        assert row["started_at"] <= row["finished_at"]
        [attempt] = await opened_all(stores, await stores.executions.execution_attempts(row["id"]))
        assert attempt["attempt"] == 1
        assert attempt["worker_id"] == runtime.worker_id
        assert attempt["state"] == "SUCCEEDED"
        assert attempt["started_at"] <= attempt["finished_at"]
    assert runtime.stats.started == 3 and runtime.stats.succeeded == 3


async def test_an_idle_worker_stops_fetching_and_still_starts_new_work_woken_or_not(
    stores: Stores, publisher: KafkaPublisher, redis: Redis, settings: WorkerSettings, pool: str
) -> None:
    """Idle, the consumer parks (its partitions paused: no broker fetch); a publish announced on Redis, and one that
    is not (the parked worker's own look every second finds it), both run."""
    async with serving(demo_worker(pool), settings) as runtime:
        consumer = runtime.consumer
        assert isinstance(consumer, KafkaExecutionConsumer)
        await runtime.ready.wait()

        async def parked() -> bool:
            return consumer._paused

        # Parked only once its partitions have settled (5 s after the assignment) and nothing came for 0.5 s.
        await wait_until(parked, "the idle consumer to park", within=30)
        announced = await dispatch(stores, pool, "echo", [{"n": 1}])
        await publish(WakingPublisher(publisher, redis), announced)
        await wait_state(stores, announced[0], "SUCCEEDED")
        await wait_until(parked, "the consumer to park again", within=30)
        silent = await dispatch(stores, pool, "echo", [{"n": 2}])
        await publish(publisher, silent)
        await wait_state(stores, silent[0], "SUCCEEDED")


async def test_a_message_of_a_tenant_the_pool_does_not_admit_never_reaches_the_handler(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str, database_url: str
) -> None:
    """Defence in depth: tenant B's work injected into A's topic (a forged or misrouted message) is refused by A's
    worker — the attempt FAILED with the reason, the handler never called — while A's own work runs."""
    calls: list[tuple[str, Any]] = []
    worker = Worker(pool=pool)

    @worker.handler("record")
    async def record(ctx: Context, payload: Any) -> None:
        calls.append((ctx.tenant, payload))

    admit(database_url, "b-pool", "intruder")  # registers tenant `intruder`; `pool` admits acme only
    async with serving(worker, settings, pool_cache_sec=0.2) as runtime:
        [foreign] = await dispatch(stores, pool, "record", [{"who": "b"}], tenant="intruder")
        # A message claiming to be acme's for an execution that is the intruder's: refused as well.
        [disguised] = await dispatch(stores, pool, "record", [{"who": "b2"}], tenant="intruder", message_tenant=TENANT)
        [own] = await dispatch(stores, pool, "record", [{"who": "a"}])
        await publish(publisher, [foreign, disguised, own])
        refused = [await wait_state(stores, m, "DEAD", tenant="intruder") for m in (foreign, disguised)]
        await wait_state(stores, own, "SUCCEEDED")
    assert calls == [(TENANT, {"who": "a"})]
    assert refused[0]["error"] == f"PoolRefused: pool '{pool}' is not open to tenant 'intruder'"
    assert refused[1]["error"].startswith("PoolRefused: the message claims tenant 'acme'")
    [attempt] = await stores.executions.execution_attempts(refused[0]["id"])
    assert attempt["state"] == "FAILED" and attempt["worker_id"] == runtime.worker_id
    assert runtime.stats.refused == 2 and runtime.stats.succeeded == 1
    # Audited: the execution's trail says which worker refused it, and why.
    trail = await stores.database.pool.fetch(
        "SELECT actor, detail FROM audit_log WHERE entity_id = $1 AND action = 'finish'", refused[0]["id"]
    )
    assert [(r["actor"], r["detail"]["errorClass"]) for r in trail] == [(runtime.worker_id, "PoolRefused")]


async def test_failing_handler_records_failed_with_type_and_message(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str
) -> None:
    async with serving(demo_worker(pool), settings):
        [message] = await dispatch(stores, pool, "fail", [{}])  # maxAttempts 1: no retry
        await publish(publisher, [message])
        row = await wait_state(stores, message, "DEAD")
    assert row["error"] == "RuntimeError: demo failure"
    assert row["result"] is None and row["next_attempt_at"] is None
    [attempt] = await opened_all(stores, await stores.executions.execution_attempts(row["id"]))
    assert (attempt["state"], attempt["error"]) == ("FAILED", "RuntimeError: demo failure")


async def test_unknown_handler_fails_with_a_clear_error(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str
) -> None:
    async with serving(demo_worker(pool), settings):
        [message] = await dispatch(stores, pool, "sned_email", [{}])
        await publish(publisher, [message])
        row = await wait_state(stores, message, "DEAD")
    assert row["error"] == f"UnknownHandler: pool '{pool}' has no handler 'sned_email' (registered: echo, fail, sleep)"


async def test_handler_over_its_timeout_is_cancelled_and_timed_out(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str
) -> None:
    cancelled = asyncio.Event()
    worker = Worker(pool=pool)

    @worker.handler("hang")
    async def hang(ctx: Context, payload: Any) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with serving(worker, settings):
        [message] = await dispatch(stores, pool, "hang", [{}], timeout_sec=1)
        await publish(publisher, [message])
        row = await wait_state(stores, message, "DEAD")
    assert cancelled.is_set()
    [attempt] = await opened_all(stores, await stores.executions.execution_attempts(row["id"]))
    assert attempt["state"] == "TIMED_OUT"
    assert row["error"] == "TimeoutError: handler 'hang' exceeded timeoutSec=1"
    assert (row["finished_at"] - row["started_at"]).total_seconds() >= 1


async def test_sync_handler_runs_in_the_thread_pool(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str, spans: InMemorySpanExporter
) -> None:
    worker = Worker(pool=pool)

    @worker.handler("blocking")
    def blocking(ctx: Context, payload: Any) -> dict[str, Any]:
        time.sleep(0.05)  # a blocking call: it must not stall the event loop
        return {"thread": threading.current_thread().name, "doubled": payload["x"] * 2, "trace_id": ctx.trace_id}

    async with serving(worker, settings):
        [message] = await dispatch(stores, pool, "blocking", [{"x": 21}])
        await publish(publisher, [message])
        row = await wait_state(stores, message, "SUCCEEDED")
    assert row["result"]["doubled"] == 42
    assert row["result"]["thread"].startswith("sundial-handler")
    [span] = [s for s in spans.get_finished_spans() if s.name == "blocking"]  # the handler span, current in its thread
    assert row["result"]["trace_id"] == format(span.context.trace_id, "032x")


async def test_no_more_executions_are_claimed_than_can_run(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str
) -> None:
    active = 0
    most_active = 0
    claim_to_start: list[float] = []
    worker = Worker(pool=pool)
    # A message claimed without a free slot would sit claimed for a whole run of an earlier handler; a run long
    # beside the claim-to-start of a loaded machine keeps the two apart.
    run_sec = 0.6

    @worker.handler("slow")
    async def slow(ctx: Context, payload: Any) -> None:
        nonlocal active, most_active
        active += 1
        most_active = max(most_active, active)
        # How long ago this execution was claimed (PENDING → RUNNING): a message taken from Kafka
        # without a free slot would sit claimed while the earlier handlers run.
        claim_to_start.append(
            await stores.database.pool.fetchval(
                "SELECT extract(epoch FROM clock_timestamp() - started_at)::float8 FROM executions WHERE id = $1",
                ctx.execution_id,
            )
        )
        await asyncio.sleep(run_sec)
        active -= 1

    async with serving(worker, settings, concurrency=2):
        messages = await dispatch(stores, pool, "slow", [{}] * 6)
        await publish(publisher, messages)
        for m in messages:
            await wait_state(stores, m, "SUCCEEDED")
    assert most_active == 2
    assert len(claim_to_start) == 6
    assert max(claim_to_start) < run_sec * 0.8, claim_to_start


async def test_graceful_stop_waits_for_the_running_handler(
    stores: Stores, publisher: KafkaPublisher, settings: WorkerSettings, pool: str
) -> None:
    started = asyncio.Event()
    worker = Worker(pool=pool)

    @worker.handler("slow")
    async def slow(ctx: Context, payload: Any) -> str:
        started.set()
        await asyncio.sleep(1.0)
        return "done"

    async with serving(worker, settings) as runtime:
        [message] = await dispatch(stores, pool, "slow", [{}])
        await publish(publisher, [message])
        await asyncio.wait_for(started.wait(), 20)
        assert (await execution(stores, message))["state"] == "RUNNING"
        await runtime.stop()
        # stop() returned: the handler finished and its outcome is in Postgres.
        row = await execution(stores, message)
        assert (row["state"], row["result"]) == ("SUCCEEDED", "done")
        assert runtime.stats.abandoned == 0


async def test_cli_runs_an_app_and_finishes_the_running_handler_on_sigterm(
    stores: Stores, publisher: KafkaPublisher, settings_env: dict[str, str], pool: str, tmp_path: Path
) -> None:
    async with worker_process(tmp_path, pool, settings_env, "cli-worker") as worker:
        [message] = await dispatch(stores, pool, "sleep", [{"seconds": 1.5}])
        await publish(publisher, [message])
        await wait_state(stores, message, "RUNNING")
        worker.process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(worker.process.wait(), 30)
    log = worker.log
    assert code == 0, log
    row = await execution(stores, message)
    assert (row["state"], row["result"], row["worker_id"]) == ("SUCCEEDED", {"slept": 1.5}, "cli-worker"), log
    [attempt] = await opened_all(stores, await stores.executions.execution_attempts(row["id"]))
    assert attempt["progress"] == {"slept": 1.5}
    assert "worker cli-worker stopped" in log
