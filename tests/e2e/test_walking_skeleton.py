"""The walking skeleton end to end: real api, hydrator, dispatcher and worker processes over HTTP.

500 one-shot jobs due 3 s ahead must each reach SUCCEEDED exactly once. The lateness observed
(handler start − due time) is printed and written to ``.sundial/test/e2e-lateness.json`` — it is a
measurement, not an assertion.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import httpx
import pytest
from sundial_common.security.encryption import RESULT

from tests.support.processes import Processes, free_port
from tests.support.sealed import opened_values
from tests.support.tenants import tenant_token

JOBS = 500


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@pytest.mark.e2e
async def test_500_one_shot_jobs_each_succeed_exactly_once(processes: Processes, database_url: str) -> None:
    port = free_port()
    processes.start("api", "api", "--host", "127.0.0.1", "--port", str(port))
    processes.start("hydrator", "hydrator")
    processes.start("dispatcher", "dispatcher")
    processes.start("worker", "worker", "--app", "sundial_worker.demo:worker", "--concurrency", "64")
    processes.wait_http_ok("api", f"http://127.0.0.1:{port}/readyz")
    processes.wait_for_log("dispatcher", "leading with fence token")
    processes.wait_for_log("worker", "partitions assigned")

    token = tenant_token(database_url, "e2e", pools=("demo",))
    due = datetime.now(UTC) + timedelta(seconds=3)
    run_at = due.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    limit = asyncio.Semaphore(32)

    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as client:

        async def create(i: int) -> httpx.Response:
            async with limit:
                return await client.post(
                    "/v1/jobs",
                    json={
                        "name": f"e2e-{i}",
                        "type": "ONE_SHOT",
                        "runAt": run_at,
                        "target": {"pool": "demo", "handler": "echo"},
                        "payload": {"i": i},
                    },
                )

        responses = await asyncio.gather(*(create(i) for i in range(JOBS)))
        created_by = datetime.now(UTC)
        assert [r.status_code for r in responses] == [201] * JOBS, responses[0].text
        job_ids = {r.json()["jobId"] for r in responses}
        assert len(job_ids) == JOBS

        conn = await asyncpg.connect(database_url)
        try:
            deadline = asyncio.get_running_loop().time() + 60
            while True:
                done = await conn.fetchval("SELECT count(*) FROM executions WHERE state = 'SUCCEEDED'")
                if done >= JOBS or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.2)
            rows = await conn.fetch(
                """SELECT e.job_id, e.state, e.result, e.scheduled_for, e.started_at,
                          (SELECT count(*) FROM execution_attempts a WHERE a.execution_id = e.id) AS attempts
                   FROM executions e"""
            )
        finally:
            await conn.close()

        # Every job ran, each exactly once, and the handler saw its own payload.
        assert len(rows) == JOBS, f"{len(rows)} executions for {JOBS} jobs"
        assert {str(r["job_id"]) for r in rows} == job_ids
        assert [r for r in rows if r["state"] != "SUCCEEDED"] == []
        assert {r["attempts"] for r in rows} == {1}
        results = await opened_values(database_url, "e2e", (json.loads(r["result"]) for r in rows), RESULT)
        assert sorted(result["i"] for result in results) == list(range(JOBS))

        # The API tells the same story for one of them.
        some_job = next(iter(job_ids))
        job = (await client.get(f"/v1/jobs/{some_job}")).json()
        assert job["state"] == "COMPLETED"
        execution = (await client.get(f"/v1/executions/{job['latestExecutions'][0]['executionId']}")).json()
        assert execution["state"] == "SUCCEEDED" and len(execution["attempts"]) == 1
        assert execution["traceId"]

    lateness_ms = [(r["started_at"] - r["scheduled_for"]).total_seconds() * 1000 for r in rows]
    report = {
        "jobs": JOBS,
        "created_in_s": round((created_by - (due - timedelta(seconds=3))).total_seconds(), 3),
        "lateness_ms": {
            "p50": round(statistics.median(lateness_ms), 1),
            "p95": round(_percentile(lateness_ms, 0.95), 1),
            "p99": round(_percentile(lateness_ms, 0.99), 1),
            "max": round(max(lateness_ms), 1),
            "min": round(min(lateness_ms), 1),
        },
    }
    print("e2e lateness:", json.dumps(report))
    out = Path(".sundial/test/e2e-lateness.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report) + "\n")
