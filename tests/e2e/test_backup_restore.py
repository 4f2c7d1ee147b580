"""The backup and restore drill, run for real: a live stack's database dumped with work in flight, the stack lost,
the dump restored into a new database, Sundial started on it with an empty Redis and etcd — and every job fires on.

The steps are the procedure of the operations guide (backup and restore): ``pg_dump --format=custom`` of the live
database, ``pg_restore`` into a fresh one, the fences moved past any token issued before, the processes started
on it. Afterwards, on the restored database: every one-shot ran exactly once; the every-second cron job has one
execution for every second from its first fire to the end, none missing and none twice (the seconds of the gap were
within its catch-up window, so each ran late); no shard's fence is below the highest one the lost stack issued.
What the lost stack ran after the backup's instant ran again (at least once): counted and printed, not refused.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aetcd
import asyncpg
import httpx
import pytest
from redis.asyncio import Redis
from sundial_infra.stack import LocalStack

from tests.support.processes import Processes, free_port
from tests.support.tenants import tenant_token

ONE_SHOTS = 24
#: The restore procedure's fence step: every shard's token past any issued before the backup's instant or after it.
#: Tokens grow by one per leadership term; milliseconds since the epoch outgrow any count of terms.
RAISE_FENCES = (
    "UPDATE shard_fence SET token = greatest(token + 1, (extract(epoch FROM clock_timestamp()) * 1000)::bigint), "
    "holder = 'restored', updated_at = now()"
)
PROCESSES = {
    "api": ("api", "--host", "127.0.0.1", "--port"),
    "dispatcher": ("dispatcher",),
    "services": ("services", "--run", "hydrator,sweeper"),
    "worker": ("worker", "--app", "sundial_worker.demo:worker"),
}
#: The restored stack republishes what was PENDING at the backup (its messages were consumed by the lost one) after
#: this long, not the default minute.
RESTORED_ENV = {"SUNDIAL_SWEEPER_UNSTARTED_AFTER_SEC": "5", "SUNDIAL_SWEEPER_UNPUBLISHED_AFTER_SEC": "2"}


def _start(processes: Processes, suffix: str, api_port: int, env: dict[str, str] | None = None) -> None:
    for kind, args in PROCESSES.items():
        processes.start(f"{kind}-{suffix}", *args, *((str(api_port),) if kind == "api" else ()), env=env)
    processes.wait_http_ok(f"api-{suffix}", f"http://127.0.0.1:{api_port}/readyz")
    processes.wait_for_log(f"dispatcher-{suffix}", "leading with fence token")
    processes.wait_for_log(f"worker-{suffix}", "partitions assigned")


def _retry_fast() -> dict[str, object]:
    return {"maxAttempts": 3, "backoff": "FIXED", "initialDelayMs": 200, "jitter": False}


@pytest.mark.e2e
async def test_a_restored_backup_fires_every_job_on_and_loses_nothing_due_in_the_gap(
    processes: Processes, database_url: str, stack: LocalStack, etcd_endpoint: str, redis_url: str, tmp_path: Path
) -> None:
    bindir = stack.postgres.bindir
    lost_api = free_port()
    _start(processes, "lost", lost_api)
    token = tenant_token(database_url, "drill", pools=("demo",))
    target = {"pool": "demo", "handler": "echo"}
    first_due = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=3)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{lost_api}", headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as api:
        cron = await api.post(
            "/v1/jobs",
            json={
                "name": "every-second",
                "type": "CRON",
                "schedule": "* * * * * *",
                "startAt": first_due.isoformat().replace("+00:00", "Z"),
                "target": target,
                "retryPolicy": _retry_fast(),
            },
        )
        assert cron.status_code == 201, cron.text
        shots = []
        for i in range(ONE_SHOTS):  # one every second from the first due one: before, across and after the gap
            run_at = (first_due + timedelta(seconds=i)).isoformat().replace("+00:00", "Z")
            made = await api.post(
                "/v1/jobs",
                json={
                    "name": f"shot-{i}",
                    "type": "ONE_SHOT",
                    "runAt": run_at,
                    "target": target,
                    "retryPolicy": _retry_fast(),
                },
            )
            assert made.status_code == 201, made.text
            shots.append(made.json()["jobId"])
    cron_id = cron.json()["jobId"]

    # The backup, taken while jobs fire every second (pg_dump reads one consistent snapshot).
    await asyncio.sleep((first_due - datetime.now(UTC)).total_seconds() + 6)
    dump = tmp_path / "sundial.dump"
    backed_up = datetime.now(UTC)
    await asyncio.to_thread(
        subprocess.run,
        [str(bindir / "pg_dump"), "--format=custom", f"--file={dump}", f"--dbname={database_url}"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    await asyncio.sleep(4)  # the lost stack runs on past the backup's instant: these runs are not in the backup
    for name in list(processes.running):  # the disaster: every process gone at once, work in flight
        processes.stop(name, sig=signal.SIGKILL)
    lost = await asyncpg.connect(database_url)
    try:
        lost_fences = {r["shard"]: r["token"] for r in await lost.fetch("SELECT shard, token FROM shard_fence")}
        lost_runs = {
            (str(r["job_id"]), r["scheduled_for"])
            for r in await lost.fetch("SELECT job_id, scheduled_for FROM executions WHERE started_at IS NOT NULL")
        }
    finally:
        await lost.close()

    # The restore: a new database, the dump, the fences; Redis and etcd empty, as a rebuilt stack's would be.
    restored = database_url.rsplit("/", 1)[0] + "/" + database_url.rsplit("/", 1)[1] + "_restored"
    admin = await asyncpg.connect(stack.postgres_dsn)
    try:
        await admin.execute(f"CREATE DATABASE {restored.rsplit('/', 1)[1]}")
    finally:
        await admin.close()
    try:
        await asyncio.to_thread(
            subprocess.run,
            [str(bindir / "pg_restore"), "--no-owner", "--exit-on-error", f"--dbname={restored}", str(dump)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        conn = await asyncpg.connect(restored)
        try:
            await conn.execute(RAISE_FENCES)
        finally:
            await conn.close()
        redis = Redis.from_url(redis_url)
        try:
            await redis.flushall()
        finally:
            await redis.aclose()
        host, port = etcd_endpoint.rsplit(":", 1)
        async with aetcd.Client(host=host, port=int(port)) as etcd:
            await etcd.delete_prefix(b"/sundial/")

        restarted = datetime.now(UTC)
        _start(processes, "restored", free_port(), env={"SUNDIAL_DATABASE_URL": restored, **RESTORED_ENV})
        window_end = max(
            first_due + timedelta(seconds=ONE_SHOTS - 1), (restarted + timedelta(seconds=4)).replace(microsecond=0)
        )
        rows, fences = await _settled(restored, window_end)
    finally:
        processes.stop_all()
        admin = await asyncpg.connect(stack.postgres_dsn)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {restored.rsplit('/', 1)[1]} WITH (FORCE)")
        finally:
            await admin.close()

    by_job: dict[str, list[asyncpg.Record]] = {}
    for row in rows:
        by_job.setdefault(str(row["job_id"]), []).append(row)
    # Every one-shot ran exactly once on the restored stack, the ones due in the gap late.
    ran = {job: [r["state"] for r in by_job.get(job, [])] for job in shots}
    assert {job: states for job, states in ran.items() if states != ["SUCCEEDED"]} == {}
    # The cron job: one execution per second from its first fire to the window's end, none missing, none twice.
    seconds = sorted(r["scheduled_for"] for r in by_job[cron_id] if r["scheduled_for"] <= window_end)
    expected = [first_due + timedelta(seconds=i) for i in range(int((window_end - first_due).total_seconds()) + 1)]
    assert seconds == expected, (
        f"missing {sorted(set(expected) - set(seconds))}, twice {len(seconds) - len(set(seconds))}"
    )
    assert {r["state"] for r in by_job[cron_id] if r["scheduled_for"] <= window_end} == {"SUCCEEDED"}
    # No fence went backwards: every shard's token is above the highest the lost stack issued.
    assert all(fences.get(shard, 0) > token for shard, token in lost_fences.items()), (lost_fences, fences)
    # At least once: what the lost stack ran after the backup's instant ran again on the restored one.
    again = [(job, at) for job, at in lost_runs if at >= backed_up - timedelta(seconds=1)]
    gap = [
        (r["started_at"] - r["scheduled_for"]).total_seconds()
        for r in rows
        if r["started_at"] is not None and r["scheduled_for"] < restarted
    ]
    print(
        "restore drill:",
        json.dumps(
            {
                "one_shot_jobs": ONE_SHOTS,
                "cron_occurrences": len(seconds),
                "ran_before_the_loss_and_again": len(again),
                "gap_s": round((restarted - backed_up).total_seconds(), 1),
                "max_lateness_s": round(max(gap, default=0.0), 1),
            }
        ),
    )


async def _settled(dsn: str, window_end: datetime) -> tuple[list[asyncpg.Record], dict[int, int]]:
    """Every execution and every fence once all that was due by ``window_end`` has ended (or 90 s have passed)."""
    connection = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            open_ = await connection.fetchval(
                "SELECT count(*) FROM executions WHERE scheduled_for <= $1 AND state NOT IN ('SUCCEEDED', 'DEAD')",
                window_end,
            )
            if datetime.now(UTC) > window_end + timedelta(seconds=2) and open_ == 0:
                break
            await asyncio.sleep(0.5)
        rows = await connection.fetch("SELECT job_id, state, scheduled_for, started_at FROM executions")
        fences = {r["shard"]: r["token"] for r in await connection.fetch("SELECT shard, token FROM shard_fence")}
        return rows, fences
    finally:
        await connection.close()
