"""Reliable execution end to end, as a tenant sees it over HTTP with the real processes and the demo worker.

One stack, four stories: a flaky handler succeeds on its third attempt; a failing one goes DEAD, shows up in
``GET /v1/executions?state=DEAD`` and on ``sundial.dlq``, and ``POST …/retry`` runs it once more; a long
handler is cancelled while it runs; a create retried with its ``Idempotency-Key`` makes one job.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from sundial_common.broker.kafka import ensure_topics
from sundial_common.broker.messages import DLQ_TOPIC

from tests.support.processes import Processes, free_port
from tests.support.tenants import tenant_token

T = TypeVar("T")
FAST = {
    "SUNDIAL_SWEEPER_INTERVAL_SEC": "0.5",
    "SUNDIAL_WORKER_HEARTBEAT_INTERVAL_SEC": "0.5",
    "SUNDIAL_WORKER_HEARTBEAT_TTL_SEC": "3",
}
QUICK = {"backoff": "FIXED", "initialDelayMs": 300, "maxDelayMs": 300, "jitter": False}


async def until(check: Callable[[], Awaitable[T | None]], within: float, what: str) -> T:
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within}s")
        await asyncio.sleep(0.1)


def dead_letters(bootstrap: str, execution_id: str, timeout: float = 15.0) -> list[dict[str, Any]]:
    import orjson

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex}"})
    try:
        partitions = consumer.list_topics(DLQ_TOPIC, timeout=10).topics[DLQ_TOPIC].partitions
        consumer.assign([TopicPartition(DLQ_TOPIC, p, OFFSET_BEGINNING) for p in partitions])
        found: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while not found and time.monotonic() < deadline:
            for raw in consumer.consume(num_messages=500, timeout=0.3):
                value = raw.value()
                if raw.error() is None and value is not None:
                    letter = orjson.loads(value)
                    if letter["execution_id"] == execution_id:
                        found.append(letter)
        return found
    finally:
        consumer.close()


@pytest.mark.e2e
async def test_retries_dead_letters_manual_retry_cancellation_and_idempotent_create(
    processes: Processes, kafka_bootstrap: str
) -> None:
    ensure_topics(kafka_bootstrap, [DLQ_TOPIC])
    port = free_port()
    processes.start("api", "api", "--host", "127.0.0.1", "--port", str(port))
    for name in ("hydrator", "dispatcher", "sweeper"):
        processes.start(name, name, env=FAST)
    processes.start("worker", "worker", "--app", "sundial_worker.demo:worker", "--concurrency", "8", env=FAST)
    processes.wait_http_ok("api", f"http://127.0.0.1:{port}/readyz")
    processes.wait_for_log("dispatcher", "leading with fence token")
    processes.wait_for_log("worker", "partitions assigned")
    token = tenant_token(processes.env["SUNDIAL_DATABASE_URL"], "e2e-reliable", pools=("demo",))

    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}, timeout=10
    ) as client:

        async def create(handler: str, payload: dict[str, Any], retry: dict[str, Any], key: str | None = None) -> str:
            body = {
                "name": handler,
                "type": "DELAYED",
                "delaySeconds": 0,
                "target": {"pool": "demo", "handler": handler},
                "payload": payload,
                "retryPolicy": retry,
            }
            headers = {"Idempotency-Key": key} if key else {}
            response = await client.post("/v1/jobs", json=body, headers=headers)
            assert response.status_code == 201, response.text
            return str(response.json()["jobId"])

        async def execution_of(job_id: str, state: str | None = None) -> dict[str, Any] | None:
            job = (await client.get(f"/v1/jobs/{job_id}")).json()
            if not job["latestExecutions"]:
                return None
            execution_id = job["latestExecutions"][0]["executionId"]
            view: dict[str, Any] = (await client.get(f"/v1/executions/{execution_id}")).json()
            return view if state is None or view["state"] == state else None

        flaky = await create("flaky", {"failures": 2}, {"maxAttempts": 3, **QUICK})
        failing = await create("fail", {}, {"maxAttempts": 2, **QUICK})
        sleeper = await create("sleep", {"seconds": 60}, {"maxAttempts": 3, **QUICK})
        twice = [await create("echo", {"n": 1}, {"maxAttempts": 1}, key="create-once") for _ in range(2)]

        # 1. A flaky handler: two failed attempts, each retried after its backoff, then success.
        done = await until(lambda: execution_of(flaky, "SUCCEEDED"), 30, "the flaky job to succeed")
        assert [a["state"] for a in done["attempts"]] == ["FAILED", "FAILED", "SUCCEEDED"]
        assert done["result"] == {"attempt": 3}

        # 2. A failing handler uses up its attempts: DEAD, listed, dead-lettered; a manual retry runs it again.
        dead = await until(lambda: execution_of(failing, "DEAD"), 30, "the failing job to be DEAD")
        assert (dead["attempt"], dead["nextAttemptAt"]) == (2, None)
        listed = (await client.get("/v1/executions", params={"state": "DEAD"})).json()["items"]
        assert [e["executionId"] for e in listed] == [dead["executionId"]]
        [letter] = await asyncio.to_thread(dead_letters, kafka_bootstrap, dead["executionId"])
        # The dead letter carries the error as stored: its class readable, its message sealed with the tenant's key.
        assert letter["attempt"] == 2 and letter["error"].startswith("RuntimeError: sdl1:")
        retried = await client.post(f"/v1/executions/{dead['executionId']}/retry")
        assert retried.status_code == 202, retried.text

        async def dead_again() -> dict[str, Any] | None:
            view = await execution_of(failing, "DEAD")
            return view if view is not None and view["attempt"] == 3 else None

        again = await until(dead_again, 30, "the manual retry to run (and fail) once more")
        assert [a["state"] for a in again["attempts"]] == ["FAILED", "FAILED", "FAILED"]

        # 3. Cancel a running execution: its handler stops within a second or so; it is not retried.
        running = await until(lambda: execution_of(sleeper, "RUNNING"), 30, "the sleeper to run")
        asked = time.monotonic()
        cancel = await client.post(f"/v1/executions/{running['executionId']}/cancel")
        assert cancel.status_code == 202 and cancel.json()["cancelRequestedAt"], cancel.text
        cancelled = await until(lambda: execution_of(sleeper, "CANCELLED"), 10, "the sleeper to be cancelled")
        assert time.monotonic() - asked < 3.0
        assert [a["state"] for a in cancelled["attempts"]] == ["CANCELLED"]
        again_cancel = await client.post(f"/v1/executions/{running['executionId']}/cancel")
        assert again_cancel.status_code == 409

        # 4. The create retried with its Idempotency-Key registered one job.
        assert twice[0] == twice[1]
