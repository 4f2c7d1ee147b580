"""A worker gateway killed (SIGKILL) mid-work, with two gateways and a Python SDK worker in gateway mode.

The whole stack runs (``FaultStack``: api, hydrator, dispatcher, sweeper) with no direct worker; the pool's only
worker is ``sundial worker`` with ``SUNDIAL_WORKER_GATEWAY=<a>,<b>`` and a pool token. Jobs whose handlers take
1.5 s fall due steadily; once some run, gateway A — the one the worker talks to — is killed. Then:

* the worker moves to gateway B within twice the 2 s target (its next call after the kill);
* nothing is lost: every job ends SUCCEEDED — what B was never told of comes to it when A's partitions move, and
  what A started but never handed out is ended by the sweeper once its liveness key lapses, and retried;
* no second accepted success: one SUCCEEDED finish per execution (``FaultStack.check``), the attempts that were
  running during the kill finished through B with the attempt tokens A issued.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import asyncpg
import pytest
from sundial_common.runtime.settings import CommonSettings
from sundial_common.security.auth import symmetric_keys
from sundial_common.security.pool_tokens import issue_pool_token

from tests.faults.harness import FaultStack, budget, one_shots, scaled
from tests.support.ha import eventually
from tests.support.processes import free_port

pytestmark = [pytest.mark.faults, pytest.mark.timeout(int(budget(300)))]

JOBS, SPREAD_SEC, HANDLER_MS = scaled(150), 12.0, 1500
#: The target for a worker to carry on through another gateway, and the margin the test allows.
MOVE_TARGET_SEC = 2.0


async def _pool_token(database_url: str, pool: str, tenant: str) -> str:
    token_id = f"pt_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "INSERT INTO pool_tokens (id, pool, tenant, subject, created_by, ttl_sec) VALUES ($1, $2, $3, $4, $5, $6)",
            token_id,
            pool,
            tenant,
            "fault-worker",
            "test",
            3600,
        )
    finally:
        await conn.close()
    key = symmetric_keys(CommonSettings())[0]  # the development key every process of the stack verifies with
    return issue_pool_token(key, token_id=token_id, pool=pool, tenant=tenant, subject="fault-worker", ttl_sec=3600)


async def test_a_gateway_killed_mid_work_loses_nothing_and_its_worker_moves_on(
    settings_env: dict[str, str], tmp_path: Path
) -> None:
    stack = FaultStack(
        settings_env,
        tmp_path,
        workers=0,
        extra_env={"SUNDIAL_GATEWAY_HEARTBEAT_TTL_SEC": "3", "SUNDIAL_GATEWAY_SESSION_TIMEOUT_SEC": "3"},
    )
    stack.start()
    try:
        urls = {}
        for name in ("gateway-a", "gateway-b"):
            port = free_port()
            stack.extra.start(name, "gateway", "--port", str(port))
            urls[name] = f"http://127.0.0.1:{port}"
        for name, url in urls.items():
            stack.extra.wait_http_ok(name, f"{url}/healthz", timeout=budget(60))
        token = await _pool_token(stack.database_url, stack.pool, "faults")
        stack.extra.start(
            "gateway-worker",
            "worker",
            "--app",
            "tests.faults.app:worker",
            env={"SUNDIAL_WORKER_GATEWAY": f"{urls['gateway-a']},{urls['gateway-b']}", "SUNDIAL_WORKER_TOKEN": token},
        )
        await stack.ready()
        ids = await stack.create_jobs(
            one_shots(stack.pool, JOBS, start_in=4.0, spread=SPREAD_SEC, payload={"ms": HANDLER_MS})
        )

        async def working() -> bool:
            rows = await stack.fetch("SELECT count(*) AS n FROM executions WHERE state = 'RUNNING'")
            return int(rows[0]["n"]) >= 5

        await eventually(working, budget(60), "handlers to be running through gateway A")
        os.kill(stack.extra.running["gateway-a"].pid, signal.SIGKILL)
        killed_at = time.monotonic()

        def moved() -> bool:
            return f"trying {urls['gateway-b']}" in stack.log("gateway-worker")

        await eventually(moved, 2 * MOVE_TARGET_SEC, "the worker to move to gateway B")
        moved_after = time.monotonic() - killed_at
        await stack.wait_terminal(JOBS, within=120)
        report = await stack.check(ids)
        print(f"\ngateway killed mid-work: worker moved after {moved_after:.2f}s; {report.line()}")
        # The attempts A started were finished (through B) or ended by the sweeper and retried: never lost.
        assert report.attempt_states["SUCCEEDED"] == JOBS
    finally:
        stack.stop()
