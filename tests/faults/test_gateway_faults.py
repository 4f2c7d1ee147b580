"""A worker gateway killed (SIGKILL) mid-work, mid-pull, mid-start and mid-finish, with two gateways and a Python SDK
worker in gateway mode.

The whole stack runs (``FaultStack``: api, hydrator, dispatcher, sweeper) with no direct worker; the pool's only
worker is ``sundial worker`` with ``SUNDIAL_WORKER_GATEWAY=<a>,<b>`` and a pool token. Jobs whose handlers take
1.5 s fall due steadily; once some run, gateway A — the one the worker talks to — is killed. Then:

* the worker moves to gateway B within twice the 2 s target (its next call after the kill);
* nothing is lost: every job ends SUCCEEDED — what B was never told of comes to it when A's partitions move, and
  what A started but never handed out is ended by the sweeper once its liveness key lapses, and retried;
* no second accepted success: one SUCCEEDED finish per execution (``FaultStack.check``), the attempts that were
  running during the kill finished through B with the attempt tokens A issued.

The three instants of a call are hit exactly with the gateway's test hook (``SUNDIAL_GATEWAY_TEST_PAUSE_AT``):
gateway A holds the first call that reaches the point and is killed while it waits there —

* ``pull``: messages taken from the broker, not started (their offsets uncommitted: B's pulls take them again);
* ``start``: executions started (the compare-and-swap committed, liveness keys set) but never handed out: the
  sweeper ends each once its key lapses and the retry runs through B;
* ``finish``: outcomes written but not answered: the worker repeats its finish through B, which answers it accepted
  as first recorded.

``make test`` runs each instant once; ``make chaos`` (``SUNDIAL_FAULT_MATRIX=1``) repeats each three times.
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
#: The instants' cases: short (a few jobs, a short handler) — the kill lands on the first call to reach the point.
PAUSED_JOBS, PAUSED_SPREAD_SEC, PAUSED_HANDLER_MS = scaled(24), 3.0, 300
REPEATS = 3 if os.environ.get("SUNDIAL_FAULT_MATRIX") == "1" else 1
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
    stack = _stack(settings_env, tmp_path)
    stack.start()
    try:
        urls = await _gateways_and_worker(stack)
        ids = await stack.create_jobs(
            one_shots(stack.pool, JOBS, start_in=4.0, spread=SPREAD_SEC, payload={"ms": HANDLER_MS})
        )

        async def working() -> bool:
            rows = await stack.fetch("SELECT count(*) AS n FROM executions WHERE state = 'RUNNING'")
            return int(rows[0]["n"]) >= 5

        await eventually(working, budget(60), "handlers to be running through gateway A")
        os.kill(stack.extra.running["gateway-a"].pid, signal.SIGKILL)
        killed_at = time.monotonic()

        moved_after = await _moved(stack, urls, killed_at)
        await stack.wait_terminal(JOBS, within=120)
        report = await stack.check(ids)
        print(f"\ngateway killed mid-work: worker moved after {moved_after:.2f}s; {report.line()}")
        # The attempts A started were finished (through B) or ended by the sweeper and retried: never lost.
        assert report.attempt_states["SUCCEEDED"] == JOBS
    finally:
        stack.stop()


def _stack(settings_env: dict[str, str], tmp_path: Path) -> FaultStack:
    return FaultStack(
        settings_env,
        tmp_path,
        workers=0,
        extra_env={"SUNDIAL_GATEWAY_HEARTBEAT_TTL_SEC": "3", "SUNDIAL_GATEWAY_SESSION_TIMEOUT_SEC": "3"},
    )


async def _gateways_and_worker(stack: FaultStack, pause_at: str = "") -> dict[str, str]:
    """Gateways A (held at ``pause_at``, if named) and B, and a gateway-mode worker that tries A first."""
    urls = {}
    for name in ("gateway-a", "gateway-b"):
        port = free_port()
        hook = {"SUNDIAL_GATEWAY_TEST_PAUSE_AT": pause_at} if name == "gateway-a" and pause_at else {}
        stack.extra.start(name, "gateway", "--port", str(port), env=hook)
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
    return urls


async def _moved(stack: FaultStack, urls: dict[str, str], killed_at: float) -> float:
    """Seconds from the kill until the worker moved to gateway B (at most twice the target)."""

    def moved() -> bool:
        return f"trying {urls['gateway-b']}" in stack.log("gateway-worker")

    await eventually(moved, 2 * MOVE_TARGET_SEC, "the worker to move to gateway B")
    return time.monotonic() - killed_at


@pytest.mark.parametrize("repeat", range(REPEATS), ids=lambda r: f"run{r + 1}")
@pytest.mark.parametrize("point", ["pull", "start", "finish"])
async def test_a_gateway_killed_at_an_instant_of_a_call_loses_nothing(
    settings_env: dict[str, str], tmp_path: Path, point: str, repeat: int
) -> None:
    stack = _stack(settings_env, tmp_path)
    stack.start()
    try:
        urls = await _gateways_and_worker(stack, pause_at=point)
        ids = await stack.create_jobs(
            one_shots(
                stack.pool, PAUSED_JOBS, start_in=3.0, spread=PAUSED_SPREAD_SEC, payload={"ms": PAUSED_HANDLER_MS}
            )
        )
        await stack.wait_for_log("gateway-a", f"test hook: paused at {point}", within=budget(60))
        os.kill(stack.extra.running["gateway-a"].pid, signal.SIGKILL)
        killed_at = time.monotonic()
        moved_after = await _moved(stack, urls, killed_at)
        await stack.wait_terminal(PAUSED_JOBS, within=budget(90))
        report = await stack.check(ids)
        print(f"\ngateway killed at {point}: worker moved after {moved_after:.2f}s; {report.line()}")
        # Every job succeeded once: what A took, started or finished was taken again, retried or answered by B.
        assert report.attempt_states["SUCCEEDED"] == PAUSED_JOBS
        if point == "finish":
            # The finish A wrote but never answered was repeated through B and answered accepted, not rejected.
            assert "rejected" not in stack.log("gateway-worker")
    finally:
        stack.stop()
