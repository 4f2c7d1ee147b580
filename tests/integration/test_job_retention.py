"""Job retention (sundial_sweeper.job_retention): one-shot jobs that ended go once none of their executions can
remain — they ended a day before the oldest day of ``executions`` left — and every other job stays."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sundial_common.ids import new_id
from sundial_common.stores import Stores
from sundial_sweeper.job_retention import JobRetention, JobRetentionConfig, JobRetentionPass

from tests.pools import admit_async

TENANT = "acme"


async def job(
    stores: Stores, type_: str, state: str, ended_at: datetime, trigger_at: datetime | None = None
) -> uuid.UUID:
    """A job of ``type_`` that reached ``state`` at ``ended_at`` (its last change), a manual run at ``trigger_at``
    pending if given."""
    job_id = new_id()
    recurring = type_ in ("CRON", "INTERVAL")
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


async def test_one_shot_jobs_that_ended_before_their_executions_days_go_and_every_other_job_stays(
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
    ]
    parent = await job(stores, "ONE_SHOT", "COMPLETED", long_ago)
    child = await job(stores, "ONE_SHOT", "COMPLETED", long_ago)
    await stores.database.pool.execute(
        "INSERT INTO job_dependencies (child_job_id, parent_job_id, tenant_id, on_state) VALUES ($1, $2, $3, 'ANY')",
        child,
        parent,
        TENANT,
    )
    kept = [
        await job(stores, "ONE_SHOT", "COMPLETED", recently),
        await job(stores, "ONE_SHOT", "ACTIVE", long_ago),
        await job(stores, "ONE_SHOT", "PAUSED", long_ago),
        await job(stores, "CRON", "CANCELLED", long_ago),
        await job(stores, "ONE_SHOT", "COMPLETED", long_ago, trigger_at=long_ago),  # a manual run still pending
        parent,  # named by a dependency
        child,
    ]
    retention = JobRetention(stores.jobs, stores.dependencies, stores.partitions, JobRetentionConfig(batch_size=2))

    assert (await retention.run_once()).jobs == len(gone)  # in two batches of at most two
    assert await existing(stores, gone + kept) == set(kept)
    assert await stores.jobs.get_job(TENANT, gone[0]) is None  # the API's GET: 404
    assert (await retention.run_once()).jobs == 0


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
