"""A backfill on the real processes: the dispatcher is killed (SIGKILL semantics) right after committing the
first step's executions, before publishing them; its successor resumes from the committed cursor, the
sweeper sends what was never published, and every occurrence of the range runs exactly once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from tests.e2e.test_dependencies import FAST, start_stack
from tests.support.ha import eventually
from tests.support.processes import Processes
from tests.support.tenants import tenant_token


def rfc3339(instant: datetime) -> str:
    return instant.isoformat().replace("+00:00", "Z")


@pytest.mark.e2e
async def test_a_backfill_resumes_after_its_leader_is_killed_without_duplicates(processes: Processes) -> None:
    port = start_stack(processes, {"SUNDIAL_CRASH_POINT": "backfills.after_commit"})
    database_url = processes.env["SUNDIAL_DATABASE_URL"]
    token = tenant_token(database_url, "e2e-backfill", pools=["demo"])
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}, timeout=10
    ) as client:
        body = {
            "name": "every-10s",
            "type": "INTERVAL",
            "intervalSec": 10,
            "startAt": rfc3339(start),
            "target": {"pool": "demo", "handler": "echo"},
        }
        job = (await client.post("/v1/jobs", json=body)).json()["jobId"]
        window = {"from": rfc3339(start), "to": rfc3339(start + timedelta(seconds=300))}
        dry = (await client.post(f"/v1/jobs/{job}:backfill", json={**window, "dryRun": True})).json()
        assert dry["count"] == 30
        accepted = await client.post(f"/v1/jobs/{job}:backfill", json={**window, "ratePerSec": 10})
        assert accepted.status_code == 202, accepted.text
        location = accepted.headers["location"]
        assert accepted.json()["total"] == dry["count"]

        await eventually(lambda: processes.running["dispatcher"].poll() is not None, 45, "the armed dispatcher to die")
        processes.start("dispatcher-2", "dispatcher", env=FAST)

        async def finished() -> dict[str, Any] | None:
            view: dict[str, Any] = (await client.get(location)).json()
            return view if view["state"] == "DONE" and view["finished"] == view["total"] else None

        done = await eventually(finished, 60, "the backfill to finish after the dispatcher's death")
        assert done["created"] == 30
    assert "crash point backfills.after_commit reached" in processes.log("dispatcher")
    db = await asyncpg.connect(database_url)
    try:
        rows = await db.fetch(
            "SELECT scheduled_for, count(*) AS n, min(state) AS state FROM executions"
            " WHERE backfill_id IS NOT NULL GROUP BY scheduled_for ORDER BY scheduled_for"
        )
    finally:
        await db.close()
    assert [r["scheduled_for"] for r in rows] == [start + timedelta(seconds=10 * i) for i in range(30)]
    assert {(r["n"], r["state"]) for r in rows} == {(1, "SUCCEEDED")}
