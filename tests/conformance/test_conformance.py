"""The gateway worker conformance suite: any worker that implements the handler contract (``echo``, ``sleep`` with
progress, ``fail``, ``crash``: :mod:`tests.conformance.handlers`) against a real ``sundial gateway`` process, holding
only a pool token.

Run against the Python SDK in gateway mode, the shell worker (``examples/gateway-worker.sh``, curl + jq) and the
Node.js worker (``examples/gateway-worker.mjs``): delivery (each execution runs once and its result is recorded), a
heartbeat that keeps an attempt alive past its liveness TTL with its progress stored, a cancel that stops a running
handler, a failure recorded with its error type, and a crash mid-attempt that the sweeper takes back.

To run it against a worker of your own, add it to :data:`WORKERS` (an argv run from the repository root with
``SUNDIAL_WORKER_GATEWAY`` and ``SUNDIAL_WORKER_TOKEN`` or ``SUNDIAL_WORKER_TOKEN_FILE`` in its environment).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from sundial_common.broker.kafka import KafkaPublisher
from sundial_common.hotwindow.execution_signals import heartbeat_key
from sundial_common.security.auth import SymmetricKey
from sundial_common.security.pool_tokens import issue_pool_token
from sundial_common.stores import Stores
from sundial_sweeper.sweeper import Sweeper, SweeperConfig

from tests.support.pools import admit
from tests.support.ports import REPO_ROOT
from tests.support.processes import SUNDIAL, Processes, free_port
from tests.support.sealed import opened_all
from tests.support.worker import dispatch, execution, publish

pytestmark = pytest.mark.e2e

SECRET = "conformance-test-secret-0123456789abcd"
TENANT = "conform"
#: The gateway's liveness TTL here: a `sleep` of twice as long must survive on heartbeats alone.
TTL_SEC = 2.0

WORKERS: dict[str, list[str]] = {
    "python-sdk": [SUNDIAL, "worker", "--app", "tests.conformance.handlers:worker"],
    "shell": ["bash", "examples/gateway-worker.sh"],
    "node": ["node", "examples/gateway-worker.mjs"],
}
NEEDS = {"shell": ("curl", "jq"), "node": ("node",)}


@pytest.fixture
def gateway(settings_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    processes = Processes({**settings_env, "SUNDIAL_JWT_SECRET": SECRET}, tmp_path)
    port = free_port()
    processes.start(
        "gateway",
        "gateway",
        "--port",
        str(port),
        env={
            "SUNDIAL_GATEWAY_HEARTBEAT_TTL_SEC": str(TTL_SEC),
            "SUNDIAL_GATEWAY_LEAVE_AFTER_SEC": "1",
            "SUNDIAL_GATEWAY_SESSION_TIMEOUT_SEC": "2",
        },
    )
    url = f"http://127.0.0.1:{port}"
    try:
        processes.wait_http_ok("gateway", f"{url}/readyz", timeout=60)
        yield url
    finally:
        processes.stop_all()


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


async def until(predicate: Callable[[], Awaitable[bool]], what: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:.0f}s waiting for {what}")
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("kind", list(WORKERS))
async def test_a_worker_meets_the_handler_contract_through_the_gateway(
    kind: str,
    gateway: str,
    stores: Stores,
    publisher: KafkaPublisher,
    redis: Redis,
    database_url: str,
    tmp_path: Path,
) -> None:
    missing = [tool for tool in NEEDS.get(kind, ()) if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{kind} worker needs {', '.join(missing)} (make test-deps installs them)")
    pool = admit(database_url, f"conform-{uuid.uuid4().hex[:8]}", TENANT)
    record = await stores.pool_tokens.create_token(
        f"pt_{uuid.uuid4().hex[:12]}", pool, TENANT, f"{kind}-worker", "test", 600
    )
    token = issue_pool_token(
        SymmetricKey(None, SECRET), token_id=record.id, pool=pool, tenant=TENANT, subject="w", ttl_sec=600
    )
    token_file = tmp_path / "pool-token"
    token_file.write_text(token + "\n")
    env = {**os.environ, "SUNDIAL_WORKER_GATEWAY": gateway, "SUNDIAL_WORKER_TOKEN": token, "CONFORMANCE_POOL": pool}
    if kind == "python-sdk":
        # The SDK reads its token from a file, and its first gateway is down: it moves on to the next.
        del env["SUNDIAL_WORKER_TOKEN"]
        env["SUNDIAL_WORKER_TOKEN_FILE"] = str(token_file)
        env["SUNDIAL_WORKER_GATEWAY"] = f"http://127.0.0.1:1,{gateway}"
    worker = _start(WORKERS[kind], env, tmp_path / f"{kind}.log")
    try:
        await _contract(stores, publisher, redis, pool, worker)
    except BaseException:
        print((tmp_path / f"{kind}.log").read_text(errors="replace")[-4000:])
        raise
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, 9)
            worker.wait()


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """The worker, in a session of its own (its ``crash`` may kill its whole process group), logging to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


async def _contract(
    stores: Stores, publisher: KafkaPublisher, redis: Redis, pool: str, worker: subprocess.Popen[bytes]
) -> None:
    async def state(message: Any) -> str:
        return str((await execution(stores, message, TENANT))["state"])

    async def settles(message: Any, *expected: str, within: float = 40.0) -> dict[str, Any]:
        async def done() -> bool:
            return await state(message) in expected

        await until(done, f"{message.handler} to end {' or '.join(expected)}", within)
        return await execution(stores, message, TENANT)

    # Delivery: each runs once, its result recorded.
    echoes = await dispatch(stores, pool, "echo", [{"n": 1}, {"n": 2}], tenant=TENANT)
    failing = await dispatch(stores, pool, "fail", [{"message": "as the contract says"}], tenant=TENANT)
    sleeping = await dispatch(stores, pool, "sleep", [{"seconds": int(TTL_SEC * 2)}], tenant=TENANT)
    await publish(publisher, [*echoes, *failing, *sleeping])
    for message, n in zip(echoes, (1, 2), strict=True):
        assert (await settles(message, "SUCCEEDED"))["result"] == {"n": n}
    failed = await settles(failing[0], "FAILED", "DEAD")  # DEAD: no retry policy, no attempt left
    assert failed["error"].startswith("ConformanceError"), failed["error"]
    # A heartbeat keeps it alive past the liveness TTL, and carries its progress.
    slept = await settles(sleeping[0], "SUCCEEDED")
    assert slept["result"] == {"slept": int(TTL_SEC * 2)}
    attempts = await opened_all(stores, await stores.executions.execution_attempts(uuid.UUID(sleeping[0].execution_id)))
    assert [a["state"] for a in attempts] == ["SUCCEEDED"]
    # Workers report progress at their own pace (the SDK at each ctx.heartbeat, others with their heartbeats).
    assert 1 <= attempts[0]["progress"]["slept"] <= int(TTL_SEC * 2), attempts[0]["progress"]

    # A cancel stops a running handler.
    (long_sleep,) = await dispatch(stores, pool, "sleep", [{"seconds": 60}], tenant=TENANT)
    await publish(publisher, [long_sleep])

    async def running() -> bool:
        return await state(long_sleep) == "RUNNING"

    await until(running, "the long sleep to start")
    await stores.executions.cancel_execution(TENANT, uuid.UUID(long_sleep.execution_id), "test")
    await settles(long_sleep, "CANCELLED", within=20)

    # A crash mid-attempt: the liveness key lapses, and the sweeper takes the execution back.
    (crashing,) = await dispatch(stores, pool, "crash", [{}], tenant=TENANT)
    await publish(publisher, [crashing])
    await until(lambda: asyncio.to_thread(lambda: worker.poll() is not None), "the worker to crash", within=40)

    async def lapsed() -> bool:
        return await redis.exists(heartbeat_key(crashing.execution_id)) == 0

    await until(lapsed, "the crashed attempt's liveness key to lapse", within=TTL_SEC + 5)
    sweeper = Sweeper(stores, publisher, SweeperConfig(heartbeat_ttl_sec=TTL_SEC, lost_confirm_sec=0.2), redis=redis)

    async def swept() -> bool:
        await sweeper.sweep_running()
        return await state(crashing) != "RUNNING"

    await until(swept, "the sweeper to end the crashed attempt", within=15)
    ended = await stores.executions.execution_attempts(uuid.UUID(crashing.execution_id))
    assert [a["state"] for a in ended] == ["FAILED_WORKER_LOST"], [dict(a) for a in ended]
