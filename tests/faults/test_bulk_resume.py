"""A bulk operation survives kill -9 of its runner: a standby replayer takes over at the last committed batch and
acts on no row twice.

Real ``sundial replayer`` processes (elected in etcd) on the session's Postgres. A re-drive of DEAD executions is
paced so that the kill lands mid-way; afterwards every selected execution has exactly one re-drive: one audit
entry, one more attempt — none skipped, none doubled.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
from sundial_common.domain.ids import new_id
from sundial_common.stores import Stores
from sundial_common.stores.bulk import NewOperation, Selection

from tests.support.processes import Processes
from tests.support.tenants import register_tenant

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]

COUNT = 3000
RATE = 400


@pytest.fixture
def processes(settings_env: dict[str, str], tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(settings_env, tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()


async def _row(db: asyncpg.Connection, op_id: uuid.UUID) -> asyncpg.Record:
    row = await db.fetchrow("SELECT * FROM bulk_operations WHERE id = $1", op_id)
    assert row is not None
    return row


async def test_kill_9_of_the_runner_mid_operation_resumes_without_acting_twice(
    processes: Processes, stores: Stores, database_url: str
) -> None:
    await register_tenant(database_url, "acme")
    job = new_id()
    now = datetime.now(UTC)
    db = await asyncpg.connect(database_url)
    try:
        await db.execute(
            "INSERT INTO jobs (id, tenant_id, name, type, pool, handler, timeout_sec, state, shard)"
            " VALUES ($1, 'acme', 'charge', 'ONE_SHOT', 'demo', 'charge', 60, 'COMPLETED', 0)",
            job,
        )
        await db.execute(
            "INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler, state,"
            " attempt, max_attempts, timeout_sec, finished_at)"
            " SELECT e.id, 'acme', $1, $2::timestamptz - e.i * interval '1 second', 0, 1, 'demo', 'charge', 'DEAD',"
            " 3, 3, 60, $2 FROM unnest($3::uuid[]) WITH ORDINALITY AS e (id, i)",
            job,
            now,
            [new_id() for _ in range(COUNT)],
        )
        op, _ = await stores.bulk.create(
            NewOperation(
                tenant_id="acme",
                created_by="test",
                target="executions",
                action="redrive",
                selection=Selection(states=("DEAD",), job_ids=(job,)),
                rate_per_sec=RATE,
            )
        )
        env = {"SUNDIAL_LEASE_TTL_SEC": "2", "SUNDIAL_LEASE_MARGIN_SEC": "0.5"}
        processes.start("replayer-1", "replayer", env={**env, "SUNDIAL_INSTANCE_ID": "replayer-1"})
        deadline = time.monotonic() + 60
        while (await _row(db, op["id"]))["done"] < COUNT // 4:
            assert time.monotonic() < deadline, processes.log("replayer-1")[-3000:]
            await asyncio.sleep(0.05)
        processes.stop("replayer-1", signal.SIGKILL)
        at_kill = await _row(db, op["id"])
        assert at_kill["state"] == "RUNNING" and at_kill["done"] < COUNT

        processes.start("replayer-2", "replayer", env={**env, "SUNDIAL_INSTANCE_ID": "replayer-2"})
        deadline = time.monotonic() + 60
        while (done := await _row(db, op["id"]))["state"] == "RUNNING":
            assert time.monotonic() < deadline, processes.log("replayer-2")[-3000:]
            await asyncio.sleep(0.1)
        audits = await db.fetchrow(
            "SELECT count(*) AS entries, count(DISTINCT entity_id) AS rows FROM audit_log"
            " WHERE action = 'retry_request' AND actor LIKE $1",
            f"bulk-operation {op['id']}%",
        )
        attempts = await db.fetch(
            "SELECT max_attempts, count(*) AS n FROM executions WHERE job_id = $1 AND next_attempt_at IS NOT NULL"
            " GROUP BY max_attempts",
            job,
        )
    finally:
        await db.close()
    assert done["state"] == "SUCCEEDED", done["error"]
    assert (done["total"], done["done"], done["skipped"], done["failed"], done["resumes"]) == (COUNT, COUNT, 0, 0, 1)
    assert (audits["entries"], audits["rows"]) == (COUNT, COUNT)  # every row once, none twice
    assert [(r["max_attempts"], r["n"]) for r in attempts] == [(4, COUNT)]
    took = (done["finished_at"] - done["started_at"]) / timedelta(seconds=1)
    print(f"kill -9 at {at_kill['done']}/{COUNT} done; finished in {took:.1f} s at ~{COUNT / took:.0f}/s")
