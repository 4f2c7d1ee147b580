"""Executions and attempts live in daily partitions (migration 0018): the sweeper's partition loop makes the coming
days and drops expired ones only when nothing in them must stay; a database upgraded from 0017 keeps its rows
readable and writable, and the down migration gives them back in plain tables."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, date, datetime, time, timedelta

import asyncpg
from alembic import command
from sundial_common.domain.ids import id_floor, new_id
from sundial_common.stores import Stores
from sundial_common.stores.executions import Outcome
from sundial_common.stores.schema import alembic_config, upgrade
from sundial_common.testing import FakeClock
from sundial_sweeper.partitions import PartitionLoop, PartitionLoopConfig

from tests.integration.test_reliability import TENANT, make_executions


def midnight(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


def id_of(day: date) -> uuid.UUID:
    """An execution id minted at noon (UTC) of ``day``: it belongs to that day's partition."""
    base = id_floor(midnight(day) + timedelta(hours=12)).int
    return uuid.UUID(int=base | (new_id().int & ((1 << 62) - 1)))


async def copy_execution(stores: Stores, template: uuid.UUID, day: date, state: str, **columns: object) -> uuid.UUID:
    """A new execution of the template's job, created (by its id) on ``day``, in ``state``."""
    ident = id_of(day)
    await stores.database.pool.execute(
        "INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler, state,"
        " timeout_sec, finished_at)"
        " SELECT $1, tenant_id, job_id, $3, shard, fence_token, pool, handler, $2, timeout_sec,"
        "  CASE WHEN $2 IN ('PENDING', 'RUNNING') THEN NULL ELSE now() END"
        " FROM executions WHERE id = $4",
        ident,
        state,
        midnight(day) + timedelta(hours=12),
        template,
    )
    for column, value in columns.items():
        await stores.database.pool.execute(f"UPDATE executions SET {column} = $2 WHERE id = $1", ident, value)
    return ident


async def partition_names(stores: Stores, parent: str) -> set[str]:
    rows = await stores.database.pool.fetch(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass",
        parent,
    )
    return {row["relname"] for row in rows}


def day_name(parent: str, day: date) -> str:
    return f"{parent}_p{day:%Y%m%d}"


async def test_retention_drops_only_expired_days_holding_nothing_open_and_makes_the_days_ahead(
    stores: Stores,
) -> None:
    today = datetime.now(UTC).date()
    # The migration made today and a week ahead.
    made = await partition_names(stores, "executions")
    assert {day_name("executions", today + timedelta(days=n)) for n in range(8)} <= made
    assert await partition_names(stores, "execution_attempts") == {
        n.replace("executions", "execution_attempts", 1) for n in made
    }

    (message,) = await make_executions(stores, f"p-{uuid.uuid4().hex[:8]}", "work", 1)
    template = uuid.UUID(message.execution_id)
    # Today's execution (the template of the others) has ended: today holds nothing open.
    await stores.database.pool.execute(
        "UPDATE executions SET state = 'SUCCEEDED', finished_at = now() WHERE id = $1", template
    )
    finished_day, open_day, dead_day, queued_day = (today + timedelta(days=n) for n in (1, 2, 3, 4))
    finished = await copy_execution(stores, template, finished_day, "SUCCEEDED")
    await stores.database.pool.execute(
        "INSERT INTO execution_attempts (execution_id, attempt, tenant_id, worker_id, state, finished_at)"
        " VALUES ($1, 1, $2, 'w', 'SUCCEEDED', now())",
        finished,
        TENANT,
    )
    pending = await copy_execution(stores, template, open_day, "PENDING")
    dead = await copy_execution(stores, template, dead_day, "DEAD")
    await copy_execution(stores, template, queued_day, "SUCCEEDED")
    # Every event so far reached ClickHouse, except one of the queued day's.
    await stores.database.pool.execute(
        "DELETE FROM execution_events WHERE execution_id < $1", id_floor(midnight(queued_day))
    )

    # 30 days after the end of the queued day: today and the four days are past retention.
    later = midnight(queued_day + timedelta(days=31)) + timedelta(hours=1)
    loop = PartitionLoop(
        stores.partitions, PartitionLoopConfig(retention_days=30, ahead_days=7), clock=FakeClock(later)
    )
    result = await loop.run_once()
    assert (result.dropped, result.kept, result.busy) == (2, 3, 0)  # today's and the finished day's went
    assert result.created == 8  # the later today and its week ahead
    names = await partition_names(stores, "executions")
    for gone in (today, finished_day):
        assert day_name("executions", gone) not in names
        assert day_name("execution_attempts", gone) not in await partition_names(stores, "execution_attempts")
    for kept in (open_day, dead_day, queued_day):
        assert day_name("executions", kept) in names
    assert {day_name("executions", later.date() + timedelta(days=n)) for n in range(8)} <= names
    # What stayed is readable as before; what went is gone with its attempts.
    assert (await stores.executions.get_execution(TENANT, pending))["state"] == "PENDING"  # type: ignore[index]
    assert await stores.executions.get_execution(TENANT, finished) is None
    assert await stores.executions.execution_attempts(finished) == []

    # Once the pending one ended, the dead letter went to sundial.dlq and the events were replicated, all go.
    await stores.database.pool.execute(
        "UPDATE executions SET state = 'SUCCEEDED', finished_at = now() WHERE id = $1", pending
    )
    await stores.executions.mark_dead_lettered([dead])
    await stores.database.pool.execute("DELETE FROM execution_events")
    again = await loop.run_once()
    assert (again.dropped, again.kept, again.created) == (3, 0, 0)
    # A second pass has nothing left to do; retention 0 keeps everything.
    assert (await loop.run_once()).dropped == 0
    keep = PartitionLoop(
        stores.partitions, PartitionLoopConfig(retention_days=0), clock=FakeClock(later + timedelta(days=400))
    )
    assert (await keep.run_once()).dropped == 0


async def test_a_busy_parent_makes_the_pass_give_up_instead_of_queueing_writes(stores: Stores) -> None:
    later = datetime.now(UTC) + timedelta(days=40)
    loop = PartitionLoop(
        stores.partitions, PartitionLoopConfig(retention_days=30, lock_timeout_ms=100), clock=FakeClock(later)
    )
    async with stores.database.pool.acquire() as writer, writer.transaction():
        # A writer in the middle of a transaction on executions (as a dispatch or a finish is).
        await writer.execute("SELECT count(*) FROM executions")
        result = await asyncio.wait_for(loop.run_once(), 30)
    assert result.busy >= 1 and result.dropped == 0 and result.created == 0
    result = await loop.run_once()
    assert result.busy == 0 and result.created == 8 and result.dropped >= 1


# --- the upgrade from 0017 ---------------------------------------------------------------------------------


async def test_an_upgrade_from_0017_keeps_existing_executions_readable_and_writable_and_downgrades(
    blank_database: str,
) -> None:
    await upgrade(blank_database, "0017")
    db = await asyncpg.connect(blank_database)
    job, done, waiting = new_id(), new_id(), new_id()
    try:
        await db.execute("INSERT INTO tenants (id) VALUES ('acme')")
        await db.execute(
            "INSERT INTO jobs (id, tenant_id, name, type, pool, handler, timeout_sec, state, shard)"
            " VALUES ($1, 'acme', 'j', 'CRON', 'p', 'h', 30, 'ACTIVE', 0)",
            job,
        )
        for ident, state, minutes in ((done, "SUCCEEDED", 2), (waiting, "PENDING", 1)):
            await db.execute(
                "INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler,"
                " state, timeout_sec)"
                " VALUES ($1, 'acme', $2, now() - make_interval(mins => $4), 0, 1, 'p', 'h', $3, 30)",
                ident,
                job,
                state,
                minutes,
            )
        await db.execute(
            "INSERT INTO execution_attempts (execution_id, attempt, tenant_id, worker_id, state)"
            " VALUES ($1, 1, 'acme', 'w', 'SUCCEEDED')",
            done,
        )
    finally:
        await db.close()

    await upgrade(blank_database)
    stores = await Stores.connect(blank_database)
    try:
        kinds = dict(
            await stores.database.pool.fetch(
                "SELECT relname, relkind::text FROM pg_class WHERE relname IN"
                " ('executions', 'execution_attempts', 'executions_legacy', 'execution_attempts_legacy')"
            )
        )
        assert kinds == {
            "executions": "p",
            "execution_attempts": "p",
            "executions_legacy": "r",
            "execution_attempts_legacy": "r",
        }
        assert (await stores.executions.get_execution("acme", done))["state"] == "SUCCEEDED"  # type: ignore[index]
        assert [a["state"] for a in await stores.executions.execution_attempts(done)] == ["SUCCEEDED"]
        assert [r["id"] for r in await stores.executions.latest_executions(job, 10)] == [waiting, done]
        # The old rows move on as before, and the occurrence key still guards them (the legacy partition's own).
        started = await stores.executions.start_executions("w2", [(waiting, 1)])
        assert [r["id"] for r in started] == [waiting]
        assert await stores.executions.finish_executions("w2", [Outcome(waiting, 1, "SUCCEEDED")]) == {waiting}
        scheduled_for = (await stores.executions.get_execution("acme", done))["scheduled_for"]  # type: ignore[index]
        inserted = await stores.database.pool.fetchval(
            "INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler, state,"
            " timeout_sec) VALUES ($1, 'acme', $2, $3, 0, 1, 'p', 'h', 'PENDING', 30) ON CONFLICT DO NOTHING"
            " RETURNING id",
            new_id(),
            job,
            scheduled_for,
        )
        assert inserted is None
        # An execution created a day ahead lands in its own daily partition.
        tomorrow = datetime.now(UTC).date() + timedelta(days=1)
        ahead = id_of(tomorrow)
        await stores.database.pool.execute(
            "INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler, state,"
            " timeout_sec) VALUES ($1, 'acme', $2, now(), 0, 1, 'p', 'h', 'PENDING', 30)",
            ahead,
            job,
        )
        where = await stores.database.pool.fetchval(
            "SELECT tableoid::regclass::text FROM executions WHERE id = $1", ahead
        )
        assert where == day_name("executions", tomorrow)
    finally:
        await stores.close()

    await asyncio.to_thread(command.downgrade, alembic_config(blank_database), "0017")
    db = await asyncpg.connect(blank_database)
    try:
        assert await db.fetchval("SELECT relkind::text FROM pg_class WHERE relname = 'executions'") == "r"
        states = dict(await db.fetch("SELECT id, state FROM executions"))
        assert states == {done: "SUCCEEDED", waiting: "SUCCEEDED", ahead: "PENDING"}
        assert await db.fetchval("SELECT count(*) FROM execution_attempts") == 2
    finally:
        await db.close()
    # And up again, now with rows in every table.
    await upgrade(blank_database)
