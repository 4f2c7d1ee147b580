"""Trigger, then wait, on the real processes: the execution a trigger's 202 names is readable at once.

The client example — ``client.jobs.trigger(job)`` then ``client.executions.wait(id)`` — once failed
four times in five with a 404, because the shard leader creates the execution moments after the 202. Here
it runs 20 times in a row, each wait ending in the run's real outcome; then 100 jobs are triggered and waited
for at once, and the CLI triggers one by its name and follows it to its end.
"""

from __future__ import annotations

import asyncio
import subprocess

import pytest
from sundial_client import AsyncClient, Client, Retries

from tests.support.processes import SUNDIAL, Processes, free_port
from tests.support.tenants import tenant_token

RUNS = 20
AT_ONCE = 100


async def trigger_and_wait_at_once(url: str, token: str) -> list[str]:
    async with AsyncClient(url, token=token, retry=Retries(attempts=3)) as client:
        jobs = [
            {
                "name": f"burst-{i}",
                "type": "INTERVAL",
                "intervalSec": 3600,
                "target": {"pool": "demo", "handler": "echo"},
            }
            for i in range(AT_ONCE)
        ]
        created = [item.job for item in await client.jobs.create_many(jobs) if item.job is not None]
        triggered = await asyncio.gather(*(client.jobs.trigger(job.job_id) for job in created))
        finals = await asyncio.gather(
            *(client.executions.wait(t.execution_id, poll_sec=0.1, timeout=120) for t in triggered)
        )
        return [str(final.state) for final in finals]


@pytest.mark.e2e
def test_trigger_then_wait_works_every_time(processes: Processes, database_url: str) -> None:
    port = free_port()
    processes.start("api", "api", "--host", "127.0.0.1", "--port", str(port))
    processes.start("hydrator", "hydrator")
    processes.start("dispatcher", "dispatcher")
    processes.start("worker", "worker", "--app", "sundial_worker.demo:worker", "--concurrency", "4")
    processes.wait_http_ok("api", f"http://127.0.0.1:{port}/readyz")
    processes.wait_for_log("dispatcher", "leading with fence token")
    processes.wait_for_log("worker", "partitions assigned")

    token = tenant_token(database_url, "e2e", pools=("demo",))
    with Client(f"http://127.0.0.1:{port}", token=token, retry=Retries(attempts=3)) as client:
        job = client.schedule(handler="echo", pool="demo", name="on-demand").every(3600)
        outcomes = []
        for _ in range(RUNS):
            triggered = client.jobs.trigger(job.job_id)
            first = client.executions.get(triggered.execution_id)  # at once: no 404 before the dispatch
            assert first.execution_id == triggered.execution_id and first.triggered
            final = client.executions.wait(triggered.execution_id, poll_sec=0.05, timeout=60)
            outcomes.append((final.state, len(final.attempts), final.fence_token > 0))
    assert outcomes == [("SUCCEEDED", 1, True)] * RUNS

    assert asyncio.run(trigger_and_wait_at_once(f"http://127.0.0.1:{port}", token)) == ["SUCCEEDED"] * AT_ONCE

    cli = subprocess.run(
        [SUNDIAL, "jobs", "trigger", "on-demand", "--wait", "--interval", "0.1"],
        env={**processes.env, "SUNDIAL_URL": f"http://127.0.0.1:{port}", "SUNDIAL_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert cli.stdout.splitlines()[-1].split()[1] == "SUCCEEDED"
