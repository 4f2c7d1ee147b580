"""Encryption at rest, end to end: what a tenant sends is unreadable in a ``pg_dump`` and on the broker, yet
handlers and API responses see plaintext, before and after ``sundial keys rotate``; a wrong key is refused.

One job succeeds (its result echoes the payload), one fails with an error quoting it, both checkpoint it as
progress, and the first was created with an Idempotency-Key (its stored response holds the payload): every
copy Sundial keeps carries the marker, and none may show it. A third job, created before the rotation and
due after it, runs on a worker holding only the new master key.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer
from sundial_common.broker.messages import pool_topic

from tests.support.processes import SUNDIAL, Processes, free_port
from tests.support.tenants import tenant_token

MARKER = "tok-PLAINTEXT-MARKER-7c1e"
PG_DUMP = "/usr/lib/postgresql/15/bin/pg_dump"
FINAL = {"SUCCEEDED", "FAILED", "TIMED_OUT", "DEAD", "CANCELLED"}


def _at(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _job(name: str, pool: str, payload: dict[str, Any], run_in: float = 0.5) -> dict[str, Any]:
    target = {"pool": pool, "handler": "secrets"}
    return {"name": name, "type": "ONE_SHOT", "runAt": _at(run_in), "target": target, "payload": payload}


async def _finished(client: httpx.AsyncClient, job_id: str, within: float = 120.0) -> dict[str, Any]:
    """The job's execution once final, as the API shows it (with its attempts)."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        latest = (await client.get(f"/v1/jobs/{job_id}")).json()["latestExecutions"]
        if latest and latest[0]["state"] in FINAL:
            response = await client.get(f"/v1/executions/{latest[0]['executionId']}")
            return dict(response.json())
        assert asyncio.get_running_loop().time() < deadline, f"job {job_id} did not finish: {latest}"
        await asyncio.sleep(0.3)


def _broker_values(bootstrap: str, topic: str, expected: int, within: float = 30.0) -> list[bytes]:
    """Every message of ``topic`` as stored: value and header bytes, read raw from the start."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"sealed-proof-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen: list[bytes] = []
    deadline = datetime.now(UTC) + timedelta(seconds=within)
    try:
        while len(seen) < expected and datetime.now(UTC) < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            headers = repr(message.headers()).encode()  # the header values, ASCII text shown as is
            seen.append((message.value() or b"") + headers)
    finally:
        consumer.close()
    return seen


@pytest.mark.e2e
async def test_nothing_tenants_send_is_readable_at_rest_and_a_rotation_keeps_every_job_running(
    processes: Processes, database_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    pool = f"sealed-{uuid.uuid4().hex[:8]}"
    worker_args = ("worker", "--app", "tests.e2e.sealed_app:worker", "--concurrency", "8")
    pool_env = {"SUNDIAL_SEALED_POOL": pool}
    port = free_port()
    processes.start("api", "api", "--host", "127.0.0.1", "--port", str(port))
    processes.start("dispatcher", "dispatcher")  # holds no master key: it copies sealed payloads as they are
    processes.start("worker", *worker_args, env=pool_env)
    processes.wait_http_ok("api", f"http://127.0.0.1:{port}/readyz")
    processes.wait_for_log("dispatcher", "leading with fence token")
    processes.wait_for_log("worker", "partitions assigned")

    token = tenant_token(database_url, "vault", pools=[pool])
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as client:
        once = {"Idempotency-Key": f"sealed-{uuid.uuid4()}"}
        ok_body = _job("sealed-ok", pool, {"secret": MARKER})
        created = await client.post("/v1/jobs", json=ok_body, headers=once)
        assert created.status_code == 201, created.text
        ok = created.json()
        assert ok["payload"] == {"secret": MARKER}
        failing = await client.post("/v1/jobs", json=_job("sealed-bad", pool, {"secret": MARKER, "fail": True}))
        later = await client.post("/v1/jobs", json=_job("sealed-later", pool, {"secret": MARKER}, run_in=20))
        assert (failing.status_code, later.status_code) == (201, 201), (failing.text, later.text)
        # The stored response of the keyed create opens for its retry, byte for byte.
        again = await client.post("/v1/jobs", json=ok_body, headers=once)
        assert again.headers.get("Idempotent-Replayed") == "true" and again.content == created.content

        done = await _finished(client, ok["jobId"])
        assert done["state"] == "SUCCEEDED", done
        assert done["result"] == {"echo": {"secret": MARKER}, "attempt": 1}  # the handler saw the plaintext
        assert done["attempts"][0]["progress"] == {"seen": MARKER}
        failed = await _finished(client, failing.json()["jobId"])
        assert failed["state"] == "FAILED" and failed["error"] == f"ValueError: the downstream refused {MARKER}"
        assert failed["attempts"][0]["error"] == failed["error"]

    # Postgres, as a backup would hold it: the jobs are there, the marker is not.
    env = {**os.environ, "PGCONNECT_TIMEOUT": "10"}
    dump = await asyncio.to_thread(
        subprocess.run, [PG_DUMP, "--no-owner", database_url], capture_output=True, env=env, timeout=60, check=True
    )
    assert b"sealed-ok" in dump.stdout and b"sdl1:" in dump.stdout
    assert MARKER.encode() not in dump.stdout, "plaintext marker found in pg_dump"
    # The broker, as a retained topic holds it: both messages, sealed.
    messages = await asyncio.to_thread(_broker_values, kafka_bootstrap, pool_topic(pool), 2)
    assert len(messages) >= 2
    assert [m for m in messages if MARKER.encode() in m] == []

    # Rotate the master key while the job due later waits; then only the new key runs anything.
    processes.stop("worker")
    processes.stop("api")
    old_key = os.environ["SUNDIAL_MASTER_KEY"]
    new_key = base64.b64encode(os.urandom(32)).decode()
    key_file = tmp_path / "new-master.key"
    key_file.write_text(new_key + "\n")
    rotate = await asyncio.to_thread(
        subprocess.run,
        [SUNDIAL, "keys", "rotate", "--new-key-file", str(key_file)],
        capture_output=True,
        text=True,
        env=processes.env,
        timeout=60,
    )
    assert rotate.returncode == 0 and "rotated: 1 data keys" in rotate.stdout, rotate.stdout + rotate.stderr

    # Started together (Python takes seconds to start here): the old key is refused, the new one serves.
    stale = processes.start("worker-old-key", *worker_args, env={**pool_env, "SUNDIAL_MASTER_KEY": old_key})
    new_env = {**pool_env, "SUNDIAL_MASTER_KEY": new_key}
    processes.start("api-new", "api", "--host", "127.0.0.1", "--port", str(port), env=new_env)
    processes.start("worker-new", *worker_args, env=new_env)
    assert await asyncio.to_thread(stale.wait, 90) != 0
    assert "is not the one that wrapped this database's data keys" in processes.log("worker-old-key")
    processes.wait_http_ok("api-new", f"http://127.0.0.1:{port}/readyz", timeout=90)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as client:
        fresh = await client.post("/v1/jobs", json=_job("sealed-new", pool, {"secret": MARKER, "n": 2}))
        assert fresh.status_code == 201, fresh.text
        before = await _finished(client, later.json()["jobId"])
        after = await _finished(client, fresh.json()["jobId"])
        assert (before["state"], before["result"]) == ("SUCCEEDED", {"echo": {"secret": MARKER}, "attempt": 1})
        assert (after["state"], after["result"]["echo"]) == ("SUCCEEDED", {"secret": MARKER, "n": 2})
        assert (await client.get(f"/v1/jobs/{ok['jobId']}")).json()["payload"] == {"secret": MARKER}
