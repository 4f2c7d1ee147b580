"""Trigger, then wait, on the real processes: the execution a trigger's 202 names is readable at once.

The README's client example — ``client.jobs.trigger(job)`` then ``client.executions.wait(id)`` — once failed
four times in five with a 404, because the shard leader creates the execution moments after the 202. Here
it runs 20 times in a row, each wait ending in the run's real outcome.
"""

from __future__ import annotations

import pytest
from sundial_client import Client, Retries

from tests.e2e.conftest import Processes, free_port
from tests.tenants import tenant_token

RUNS = 20


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
