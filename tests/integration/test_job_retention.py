"""Job retention (sundial_sweeper.job_retention): jobs of any type that ended go once none of their executions
can remain — they last changed a day before the oldest day of ``executions`` left — with their edges, triggers
and backfills, and every job that can still make an execution, or that a dependency names, stays."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from sundial_common.domain.ids import new_id
from sundial_common.stores import Stores
from sundial_common.stores.jobs import Q as JOBS_SQL
from sundial_common.stores.schema import upgrade
from sundial_sweeper.job_retention import JobRetention, JobRetentionConfig, JobRetentionPass

from tests.integration.test_backfills import START, backfill, interval_job, minutes
from tests.integration.test_dependencies import dependent, make
from tests.support.api import Api, api  # noqa: F401  (the `api` fixture)
from tests.support.pools import admit_async

TENANT = "acme"


async def job(
    stores: Stores, type_: str, state: str, ended_at: datetime, trigger_at: datetime | None = None
) -> uuid.UUID:
    """A job of ``type_`` that reached ``state`` at ``ended_at`` (its last change), a manual run at ``trigger_at``
    pending if given."""
    job_id = new_id()
    recurring = type_ in ("CRON", "INTERVAL", "DEPENDENT")
    await stores.jobs.insert_job(
        {
            "id": job_id,
            "tenant_id": TENANT,
            "name": f"{type_.lower()}-{state.lower()}",
            "type": type_,
            "run_at": None if recurring else ended_at,
            "schedule": "*/5 * * * *" if type_ == "CRON" else None,
            "pool": "p",
            "handler": "h",
            "payload": {},
            "timeout_sec": 30,
            "shard": 0,
            "next_fire_at": ended_at,
        },
        actor="test",
    )
    await stores.database.pool.execute(
        "UPDATE jobs SET state = $2, next_fire_at = NULL, updated_at = $3, trigger_at = $4 WHERE id = $1",
        job_id,
        state,
        ended_at,
        trigger_at,
    )
    return job_id


async def existing(stores: Stores, ids: list[uuid.UUID]) -> set[uuid.UUID]:
    rows = await stores.database.pool.fetch("SELECT id FROM jobs WHERE id = ANY($1::uuid[])", ids)
    return {row["id"] for row in rows}


async def edge(stores: Stores, child: uuid.UUID, parent: uuid.UUID) -> None:
    await stores.database.pool.execute(
        "INSERT INTO job_dependencies (child_job_id, parent_job_id, tenant_id, on_state) VALUES ($1, $2, $3, 'ANY')",
        child,
        parent,
        TENANT,
    )


async def backfill_of(stores: Stores, job_id: uuid.UUID, finished_at: datetime | None) -> uuid.UUID:
    """A backfill of ``job_id``: RUNNING without ``finished_at``, else DONE then."""
    backfill_id = new_id()
    await stores.database.pool.execute(
        "INSERT INTO backfills (id, tenant_id, job_id, shard, range_from, range_to, overlap_policy, rate_per_sec,"
        " state, total, finished_at)"
        " VALUES ($1, $2, $3, 0, now() - interval '1 hour', now(), 'ALLOW', 1,"
        "  CASE WHEN $4::timestamptz IS NULL THEN 'RUNNING' ELSE 'DONE' END, 1, $4)",
        backfill_id,
        TENANT,
        job_id,
        finished_at,
    )
    return backfill_id


async def test_jobs_of_any_type_that_ended_before_their_executions_days_go_and_every_other_job_stays(
    stores: Stores, database_url: str
) -> None:
    await admit_async(database_url, "p", TENANT)
    begin = await stores.partitions.executions_begin()
    assert begin is not None and begin <= datetime.now(UTC)  # today's partition, made by the migration
    long_ago = begin - timedelta(days=40)
    recently = begin - timedelta(hours=12)  # within the margin (a day): its executions' day may still be there
    gone = [
        await job(stores, "ONE_SHOT", "COMPLETED", long_ago),
        await job(stores, "ONE_SHOT", "CANCELLED", long_ago - timedelta(seconds=1)),
        await job(stores, "DELAYED", "COMPLETED", long_ago + timedelta(seconds=1)),
        await job(stores, "CRON", "CANCELLED", long_ago),
        await job(stores, "INTERVAL", "COMPLETED", long_ago),  # its schedule ran out (endAt, maxRuns)
        await job(stores, "DEPENDENT", "CANCELLED", long_ago),
    ]
    backfilled_long_ago = await job(stores, "CRON", "CANCELLED", long_ago)
    gone.append(backfilled_long_ago)
    old_backfill = await backfill_of(stores, backfilled_long_ago, finished_at=long_ago)
    kept = [
        await job(stores, "ONE_SHOT", "COMPLETED", recently),
        await job(stores, "CRON", "CANCELLED", recently),
        await job(stores, "ONE_SHOT", "ACTIVE", long_ago),
        await job(stores, "CRON", "PAUSED", long_ago),
        await job(stores, "DEPENDENT", "ACTIVE", long_ago),
        await job(stores, "ONE_SHOT", "COMPLETED", long_ago, trigger_at=long_ago),  # a manual run still pending
        await job(stores, "CRON", "COMPLETED", long_ago, trigger_at=long_ago),
    ]
    running = await job(stores, "INTERVAL", "COMPLETED", long_ago)  # a backfill still creating executions
    finished_recently = await job(stores, "CRON", "COMPLETED", long_ago)  # its backfill's executions are recent
    kept += [running, finished_recently]
    await backfill_of(stores, running, finished_at=None)
    await backfill_of(stores, finished_recently, finished_at=recently)
    retention = JobRetention(stores.jobs, stores.dependencies, stores.partitions, JobRetentionConfig(batch_size=2))

    assert (await retention.run_once()).jobs == len(gone)  # in batches of at most two
    assert await existing(stores, gone + kept) == set(kept)
    assert await stores.jobs.get_job(TENANT, gone[0]) is None  # the API's GET: 404
    assert await stores.backfills.get(TENANT, old_backfill) is None  # its backfill's too
    assert (await retention.run_once()).jobs == 0


async def test_a_dependency_graph_goes_children_first_and_a_parent_a_live_job_names_stays(
    stores: Stores, database_url: str
) -> None:
    await admit_async(database_url, "p", TENANT)
    begin = await stores.partitions.executions_begin()
    assert begin is not None
    long_ago = begin - timedelta(days=40)
    # A cancelled graph (cancel with cascade): parent <- child <- grandchild, the parent cancelled last.
    parent = await job(stores, "CRON", "CANCELLED", long_ago + timedelta(seconds=2))
    child = await job(stores, "DEPENDENT", "CANCELLED", long_ago + timedelta(seconds=1))
    grandchild = await job(stores, "DEPENDENT", "CANCELLED", long_ago)
    await edge(stores, child, parent)
    await edge(stores, grandchild, child)
    # A trigger the child consumed, and one a finish recorded as it was being cancelled (never consumed).
    for consumed_at in (long_ago, None):
        await stores.database.pool.execute(
            "INSERT INTO job_triggers (tenant_id, child_job_id, shard, parent_job_id, parent_execution_id,"
            " parent_state, consumed_at) VALUES ($1, $2, 0, $3, $4, 'SUCCEEDED', $5)",
            TENANT,
            child,
            parent,
            new_id(),
            consumed_at,
        )
    # A schedule that ran out long ago, with a live DEPENDENT job still waiting on it.
    completed = await job(stores, "INTERVAL", "COMPLETED", long_ago)
    waiting = await job(stores, "DEPENDENT", "ACTIVE", long_ago)
    await edge(stores, waiting, completed)
    retention = JobRetention(stores.jobs, stores.dependencies, stores.partitions, JobRetentionConfig())

    # Each pass takes the jobs no edge names: the leaves first, their edges with them.
    assert (await retention.run_once()).jobs == 1
    assert await existing(stores, [parent, child, grandchild]) == {parent, child}
    assert (await retention.run_once()).jobs == 1
    assert await existing(stores, [parent, child]) == {parent}
    assert (await retention.run_once()).jobs == 1
    assert await existing(stores, [parent, completed, waiting]) == {completed, waiting}
    assert (await retention.run_once()).jobs == 0
    edges = await stores.database.pool.fetch("SELECT child_job_id, parent_job_id FROM job_dependencies")
    assert [(row["child_job_id"], row["parent_job_id"]) for row in edges] == [(waiting, completed)]
    assert await stores.database.pool.fetchval("SELECT count(*) FROM job_triggers") == 0


async def test_a_pass_deletes_at_most_its_batches_and_the_next_pass_goes_on(stores: Stores, database_url: str) -> None:
    await admit_async(database_url, "p", TENANT)
    begin = await stores.partitions.executions_begin()
    assert begin is not None
    ended = [await job(stores, "ONE_SHOT", "COMPLETED", begin - timedelta(days=3, seconds=i)) for i in range(5)]
    retention = JobRetention(
        stores.jobs, stores.dependencies, stores.partitions, JobRetentionConfig(batch_size=2, max_batches=1)
    )

    assert (await retention.run_once()).jobs == 2
    assert await existing(stores, ended) == set(ended[:3])  # the oldest first
    assert (await retention.run_once()).jobs == 2
    assert (await retention.run_once()).jobs == 1


async def test_nothing_goes_while_a_partition_has_no_lower_bound(stores: Stores, database_url: str) -> None:
    # An upgraded database's legacy partition (migration 0018) holds executions of any age.
    await admit_async(database_url, "p", TENANT)
    begin = await stores.partitions.executions_begin()
    assert begin is not None
    ended = await job(stores, "ONE_SHOT", "COMPLETED", begin - timedelta(days=40))
    await stores.database.pool.execute(
        "CREATE TABLE executions_legacy"
        " (LIKE executions INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED);"
        " ALTER TABLE executions ATTACH PARTITION executions_legacy FOR VALUES FROM (MINVALUE) TO "
        "('00000000-0000-7000-8000-000000000000')"
    )
    assert await stores.partitions.executions_begin() is None
    retention = JobRetention(stores.jobs, stores.dependencies, stores.partitions, JobRetentionConfig())
    assert await retention.run_once() == JobRetentionPass()
    assert await existing(stores, [ended]) == {ended}


async def test_triggers_consumed_before_the_horizon_go_and_pending_or_recent_ones_stay(
    stores: Stores, database_url: str
) -> None:
    await admit_async(database_url, "p", TENANT)
    begin = await stores.partitions.executions_begin()
    assert begin is not None
    child = await job(stores, "ONE_SHOT", "ACTIVE", begin)  # any job: the rows only need one to name

    async def trigger(consumed_at: datetime | None) -> uuid.UUID:
        return await stores.database.pool.fetchval(  # type: ignore[no-any-return]
            "INSERT INTO job_triggers (tenant_id, child_job_id, shard, parent_job_id, parent_execution_id,"
            " parent_state, created_at, consumed_at, outcome)"
            " VALUES ($1, $2, 0, $2, $3, 'SUCCEEDED', coalesce($4, now()), $4,"
            "  CASE WHEN $4::timestamptz IS NOT NULL THEN 'FIRED' END) RETURNING id",
            TENANT,
            child,
            new_id(),
            consumed_at,
        )

    gone = [await trigger(begin - timedelta(days=3)), await trigger(begin - timedelta(days=40))]
    kept = [await trigger(begin - timedelta(hours=12)), await trigger(None)]
    retention = JobRetention(stores.jobs, stores.dependencies, stores.partitions, JobRetentionConfig())

    assert await retention.run_once() == JobRetentionPass(jobs=0, triggers=2)
    rows = await stores.database.pool.fetch("SELECT id FROM job_triggers WHERE id = ANY($1::uuid[])", gone + kept)
    assert {row["id"] for row in rows} == set(kept)


async def test_a_cancelled_graph_and_its_backfill_are_404_once_pruned_and_their_audit_trail_stays(
    api: Api,  # noqa: F811
    stores: Stores,
) -> None:
    parent, _ = await interval_job(api)
    child = await make(api, dependent([parent]))
    started = await backfill(api, parent, **{"from": minutes(0), "to": minutes(10)})
    assert started.status_code == 202, started.text
    backfill_id = started.json()["backfillId"]
    cancelled = await api.client.delete(f"/v1/jobs/{parent}", params={"cascade": "true"}, headers=api.auth())
    assert cancelled.status_code == 200, cancelled.text
    # Days pass: the jobs ended (and the backfill with them) before the oldest day of executions left.
    await api.db.execute("UPDATE jobs SET updated_at = updated_at - interval '3 days'")
    await api.db.execute("UPDATE backfills SET finished_at = finished_at - interval '3 days'")
    retention = JobRetention(stores.jobs, stores.dependencies, stores.partitions, JobRetentionConfig())

    assert (await retention.run_once()).jobs == 1  # the child, with its edge
    assert (await api.client.get(f"/v1/jobs/{child}", headers=api.auth())).status_code == 404
    assert (await api.client.get(f"/v1/jobs/{parent}", headers=api.auth())).status_code == 200
    assert (await retention.run_once()).jobs == 1  # then the parent no edge names any more
    for path in (f"/v1/jobs/{parent}", f"/v1/backfills/{backfill_id}", f"/v1/jobs/{parent}/executions"):
        assert (await api.client.get(path, headers=api.auth())).status_code == 404, path
    listed = await api.client.get("/v1/jobs", headers=api.auth())
    assert listed.status_code == 200 and listed.json()["items"] == []
    # Who cancelled it stays answerable until the audit retention.
    trail = await api.client.get(f"/v1/jobs/{parent}/audit", params={"action": "cancel"}, headers=api.auth())
    assert trail.status_code == 200 and [e["action"] for e in trail.json()["items"]] == ["cancel"]


async def test_a_backfill_with_nothing_to_run_is_done_at_once_and_does_not_keep_its_job_for_ever(
    api: Api,  # noqa: F811
    stores: Stores,
) -> None:
    job_id, shard = await interval_job(api)
    for n in range(3):  # every occurrence of the range already ran
        await api.db.execute(
            "INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler, state,"
            " timeout_sec) VALUES ($1, $2, $3, $4, $5, 1, 'demo', 'echo', 'SUCCEEDED', 60)",
            new_id(),
            TENANT,
            uuid.UUID(job_id),
            START + timedelta(minutes=n),
            shard,
        )
    started = await backfill(api, job_id, **{"from": minutes(0), "to": minutes(3)})
    assert started.status_code == 202, started.text
    assert (started.json()["state"], started.json()["total"]) == ("DONE", 0)
    assert started.json()["finishedAt"] is not None, "a backfill that is DONE has finished"
    cancelled = await api.client.delete(f"/v1/jobs/{job_id}", headers=api.auth())
    assert cancelled.status_code == 200, cancelled.text
    # Days pass: the job and its backfill ended before the oldest day of executions left.
    await api.db.execute("UPDATE jobs SET updated_at = updated_at - interval '3 days'")
    await api.db.execute("UPDATE backfills SET finished_at = finished_at - interval '3 days'")
    retention = JobRetention(stores.jobs, stores.dependencies, stores.partitions, JobRetentionConfig())

    assert (await retention.run_once()).jobs == 1
    assert (await api.client.get(f"/v1/jobs/{job_id}", headers=api.auth())).status_code == 404


async def test_an_upgrade_gives_a_backfill_done_at_its_creation_its_finish_and_a_running_one_none(
    blank_database: str,
) -> None:
    await upgrade(blank_database, "0024")
    db = await asyncpg.connect(blank_database)
    job, empty, running = new_id(), new_id(), new_id()
    try:
        await db.execute("INSERT INTO tenants (id) VALUES ('acme')")
        await db.execute(
            "INSERT INTO jobs (id, tenant_id, name, type, pool, handler, timeout_sec, state, shard)"
            " VALUES ($1, 'acme', 'j', 'CRON', 'p', 'h', 30, 'CANCELLED', 0)",
            job,
        )
        for ident, state, total in ((empty, "DONE", 0), (running, "RUNNING", 5)):  # as 0024's insert wrote them
            await db.execute(
                "INSERT INTO backfills (id, tenant_id, job_id, shard, range_from, range_to, overlap_policy,"
                " rate_per_sec, state, total, created_at)"
                " VALUES ($1, 'acme', $2, 0, now() - interval '2 hours', now() - interval '1 hour', 'ALLOW', 1, $3,"
                " $4, now() - interval '50 days')",
                ident,
                job,
                state,
                total,
            )
        await upgrade(blank_database, "head")
        rows = await db.fetch("SELECT id, created_at, finished_at FROM backfills")
        finished = {r["id"]: r["finished_at"] for r in rows}
        assert finished == {empty: next(r["created_at"] for r in rows if r["id"] == empty), running: None}
    finally:
        await db.close()


# --- a request that names a job as retention deletes it ------------------------------------------------------


async def _while_retention_deletes(api: Api, stores: Stores, request: Awaitable[Any]) -> Any:  # noqa: F811
    """``request``'s answer when retention deletes a job it names under it: retention's own statement deletes the job
    in a transaction left open until ``request`` waits on the job's row (it read the job before: the read does not
    wait), then commits; the request's write goes on after the delete."""
    begin = await stores.partitions.executions_begin()
    assert begin is not None
    pruning = await asyncpg.connect(api.settings.database_url)
    try:
        async with pruning.transaction():
            deleted = await pruning.fetchval(
                JOBS_SQL["prune_ended_jobs"], begin - JobRetentionConfig().margin_days * timedelta(days=1), 100
            )
            assert deleted == 1
            sent = asyncio.ensure_future(request)
            deadline = asyncio.get_running_loop().time() + 30
            while not await api.db.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ):
                assert not sent.done(), sent.result().text  # answered without waiting on the job's row
                assert asyncio.get_running_loop().time() < deadline, "the request never reached the job's row"
                await asyncio.sleep(0.01)
        return await sent
    finally:
        await pruning.close()


@pytest.mark.parametrize("naming", ["backfill", "trigger", "a new job's parent", "a new parent of a job"])
async def test_a_request_naming_a_job_as_retention_deletes_it_is_a_404_naming_the_job_and_writes_nothing(
    api: Api,  # noqa: F811
    stores: Stores,
    naming: str,
) -> None:
    ended, _ = await interval_job(api)  # its schedule ran out (endAt) long ago: a backfill or a run is still allowed
    other, _ = await interval_job(api)
    child = await make(api, dependent([other]))
    await api.db.execute(
        "UPDATE jobs SET state = 'COMPLETED', next_fire_at = NULL, updated_at = now() - interval '40 days'"
        " WHERE id = $1",
        uuid.UUID(ended),
    )
    tables = ("jobs", "backfills", "job_dependencies", "audit_log")
    before = {t: await api.db.fetchval(f"SELECT count(*) FROM {t}") for t in tables}
    if naming == "backfill":
        request = backfill(api, ended, **{"from": minutes(0), "to": minutes(10)})
    elif naming == "trigger":
        request = api.client.post(f"/v1/jobs/{ended}/trigger", headers=api.auth())
    elif naming == "a new job's parent":
        request = api.create(dependent([ended]))
    else:
        patch = {"dependsOn": [{"jobId": ended, "on": "SUCCEEDED"}]}
        request = api.client.patch(f"/v1/jobs/{child}", json=patch, headers=api.auth())

    response = await _while_retention_deletes(api, stores, request)

    assert response.status_code == 404, response.text
    # The graph's own check names the edge's field (`dependsOn[0].jobId`: job … not found).
    assert response.json()["detail"].endswith(f"job {ended} not found"), response.text
    after = {t: await api.db.fetchval(f"SELECT count(*) FROM {t}") for t in tables}
    assert after == {**before, "jobs": before["jobs"] - 1}  # only the job retention deleted
