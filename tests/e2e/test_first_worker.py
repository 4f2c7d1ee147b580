"""A new user's first worker, as documented: ``sundial worker --app mymodule:worker`` from their own directory.

The worker is started from a fresh temporary directory with no ``SUNDIAL_*`` variable at all: it finds the running
development stack through the per-user record ``sundial dev up`` writes (``sundial_common.runtime.dev_stack``, here
under a temporary ``XDG_CONFIG_HOME``), serves the user's handlers, and leaves nothing in that directory. Without a
stack to find, it says in one line what to set and exits 2, never with a traceback.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from sundial_common.runtime import dev_stack

from tests.support.processes import SUNDIAL, Processes, free_port
from tests.support.tenants import tenant_token

MODULE = """
from sundial_worker import Worker

worker = Worker(pool="first")


@worker.handler("greet")
async def greet(ctx, payload):
    ctx.logger.info("greeting %s", payload["name"])
    await ctx.heartbeat(progress={"step": 1})
    return {"hello": payload["name"]}


@worker.handler("explode")
def explode(ctx, payload):
    ctx.logger.warning("about to explode with %d", payload["n"])

    def inner(n):
        raise RuntimeError(f"demo failure {n}")

    inner(payload["n"])
"""


def _user_env(config_home: Path) -> dict[str, str]:
    """The environment of a user's shell: no SUNDIAL_* variable, the per-user config where the test says."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUNDIAL_")}
    return {**env, "XDG_CONFIG_HOME": str(config_home), "PYTHONUNBUFFERED": "1"}


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "mymodule.py").write_text(MODULE)
    return project


def test_without_a_stack_the_worker_says_what_to_set_in_one_line(tmp_path: Path) -> None:
    project = _project(tmp_path)
    for extra in ({}, {"SUNDIAL_ENV": "dev"}):
        run = subprocess.run(
            [SUNDIAL, "worker", "--app", "mymodule:worker"],
            cwd=project,
            env={**_user_env(tmp_path / "config"), **extra},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 2, run.stderr
        assert "Traceback" not in run.stderr
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "make up" in lines[0], run.stderr
        assert "SUNDIAL_MASTER_KEY" in lines[0] or "SUNDIAL_DEV_ROOT" in lines[0]
    assert sorted(p.name for p in project.iterdir()) == ["mymodule.py"]  # no ./.sundial, no key material


@pytest.mark.e2e
def test_a_first_worker_started_anywhere_finds_the_dev_stack(
    processes: Processes, settings_env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    # The dev stack as `sundial dev up` records it: its state directory holds the development master key.
    root = tmp_path / "checkout" / ".sundial"
    root.mkdir(parents=True)
    (root / "master.key").write_text(os.environ["SUNDIAL_MASTER_KEY"] + "\n")
    config_home = tmp_path / "config"
    dev_stack.record(
        root,
        {**settings_env, "SUNDIAL_DEV_ROOT": str(root)},
        os.getpid(),
        path=dev_stack.pointer_path({"XDG_CONFIG_HOME": str(config_home)}),
    )
    port = free_port()
    processes.start("api", "api", "--host", "127.0.0.1", "--port", str(port))
    processes.start("dispatcher", "dispatcher")
    processes.start("hydrator", "hydrator")
    project = _project(tmp_path)
    with (processes.logs / "worker.log").open("ab") as log:
        processes.running["worker"] = subprocess.Popen(
            [SUNDIAL, "worker", "--app", "mymodule:worker"],
            cwd=project,
            env=_user_env(config_home),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    processes.wait_http_ok("api", f"http://127.0.0.1:{port}/readyz")
    processes.wait_for_log("worker", "using the development stack")
    processes.wait_for_log("worker", "partitions assigned")

    token = tenant_token(database_url, "first", pools=("first",))
    with httpx.Client(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as client:
        pool = client.get("/v1/pools/first").json()  # the worker is visible, with what it serves
        assert (pool["workers"]["live"], pool["workers"]["handlers"]) == (1, ["explode", "greet"]), pool
        created = client.post(
            "/v1/jobs",
            json={
                "name": "hello",
                "type": "DELAYED",
                "delaySeconds": 0,
                "target": {"pool": "first", "handler": "greet"},
                "payload": {"name": "ada"},
            },
        )
        assert created.status_code == 201, created.text
        execution = _wait_ended(client, created.json()["jobId"])
        assert execution["state"] == "SUCCEEDED", execution
        assert execution["result"] == {"hello": "ada"}
        assert execution["attempts"][0]["progress"] == {"step": 1}
        assert execution["attempts"][0]["traceback"] is None
        [line] = execution["attempts"][0]["logTail"]
        assert line.endswith(" INFO greeting ada")

        # Why did it fail, in one look: the attempt's traceback and what the handler logged before.
        failing = client.post(
            "/v1/jobs",
            json={
                "name": "boom",
                "type": "DELAYED",
                "delaySeconds": 0,
                "target": {"pool": "first", "handler": "explode"},
                "payload": {"n": 7},
                "retryPolicy": {"maxAttempts": 1},
            },
        )
        assert failing.status_code == 201, failing.text
        execution = _wait_ended(client, failing.json()["jobId"])
        assert execution["state"] == "DEAD", execution
        [attempt] = execution["attempts"]
        assert attempt["error"] == "RuntimeError: demo failure 7"
        assert attempt["traceback"].startswith("Traceback (most recent call last):")
        assert 'mymodule.py", line' in attempt["traceback"] and "in inner" in attempt["traceback"]
        assert attempt["traceback"].rstrip().endswith("RuntimeError: demo failure 7")
        assert attempt["logTail"][0].endswith(" WARNING about to explode with 7")
    stored = _stored_traceback(database_url, execution["executionId"])
    assert stored.startswith("sdl1:") and "demo failure" not in stored  # sealed at rest like the error
    assert sorted(p.name for p in project.iterdir() if p.name != "__pycache__") == ["mymodule.py"]


def _stored_traceback(database_url: str, execution_id: object) -> str:
    async def read() -> str:
        conn = await asyncpg.connect(database_url)
        try:
            value: str = await conn.fetchval(
                "SELECT traceback FROM execution_attempts WHERE execution_id = $1", uuid.UUID(str(execution_id))
            )
            return value
        finally:
            await conn.close()

    return asyncio.run(read())


def _wait_ended(client: httpx.Client, job_id: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        for latest in job.get("latestExecutions") or []:
            execution: dict[str, Any] = client.get(f"/v1/executions/{latest['executionId']}").json()
            if execution["state"] not in ("PENDING", "RUNNING"):
                return execution
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not end within {timeout}s")
