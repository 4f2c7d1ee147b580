"""audit_log lives in daily partitions (migration 0020): its rows land in the day they were written, the sweeper's
partition loop makes the coming days and drops a day once it is past SUNDIAL_AUDIT_RETENTION_DAYS, the log stays
append-only, and a database upgraded from 0019 keeps its trail readable and paged as before."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from alembic import command
from sundial_common.domain.ids import new_id
from sundial_common.stores import Stores
from sundial_common.stores.schema import alembic_config, upgrade
from sundial_common.testing import FakeClock
from sundial_sweeper.partitions import PartitionLoop, PartitionLoopConfig

from tests.integration.test_execution_partitions import day_name, midnight, partition_names
from tests.integration.test_reliability import TENANT, make_executions


async def trail(stores: Stores, execution_id: uuid.UUID) -> list[str]:
    entries = await stores.audit.entries(TENANT, "execution", execution_id)
    return [e.action for e in entries]


async def test_retention_drops_expired_audit_days_and_the_log_stays_append_only(stores: Stores) -> None:
    today = datetime.now(UTC).date()
    assert {day_name("audit_log", today + timedelta(days=n)) for n in range(8)} <= await partition_names(
        stores, "audit_log"
    )
    (message,) = await make_executions(stores, f"a-{uuid.uuid4().hex[:8]}", "work", 1)
    execution = uuid.UUID(message.execution_id)
    where = await stores.database.pool.fetchval(
        "SELECT DISTINCT tableoid::regclass::text FROM audit_log WHERE entity_id = $1", execution
    )
    assert where == day_name("audit_log", today)
    assert await trail(stores, execution) == ["dispatch"]
    for statement in ("UPDATE audit_log SET actor = 'x'", "DELETE FROM audit_log"):
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await stores.database.pool.execute(statement)

    # 89 days after today ended nothing goes; 90 days after, today's audit rows do (not today's executions: 30
    # days of execution retention would drop them anyway, so keep those forever here to see the two apart).
    config = PartitionLoopConfig(retention_days=0, audit_retention_days=90)
    almost = PartitionLoop(stores.partitions, config, clock=FakeClock(midnight(today + timedelta(days=90))))
    assert (await almost.run_once()).audit_dropped == 0
    later = midnight(today + timedelta(days=91)) + timedelta(hours=1)
    result = await PartitionLoop(stores.partitions, config, clock=FakeClock(later)).run_once()
    assert (result.audit_dropped, result.dropped, result.busy) == (1, 0, 0)  # today's day of audit rows
    assert result.audit_created == 1  # the day a week after the later today (the earlier pass made the rest)
    names = await partition_names(stores, "audit_log")
    assert day_name("audit_log", today) not in names
    assert {day_name("audit_log", later.date() + timedelta(days=n)) for n in range(8)} <= names
    assert await trail(stores, execution) == []
    assert (await stores.executions.get_execution(TENANT, execution)) is not None
    # Retention 0 keeps every day.
    keep = PartitionLoop(
        stores.partitions, PartitionLoopConfig(audit_retention_days=0), clock=FakeClock(later + timedelta(days=400))
    )
    assert (await keep.run_once()).audit_dropped == 0


async def test_an_upgrade_from_0019_keeps_the_trail_readable_and_its_ids_growing_and_downgrades(
    blank_database: str,
) -> None:
    await upgrade(blank_database, "0019")
    db = await asyncpg.connect(blank_database)
    entity = new_id()
    try:
        await db.execute("INSERT INTO tenants (id) VALUES ($1)", TENANT)
        for action in ("dispatch", "start"):
            await db.execute(
                "INSERT INTO audit_log (at, tenant_id, entity, entity_id, action, actor)"
                " VALUES (now() - interval '3 days', $1, 'execution', $2, $3, 'test')",
                TENANT,
                entity,
                action,
            )
        old_max = await db.fetchval("SELECT max(id) FROM audit_log")
    finally:
        await db.close()

    await upgrade(blank_database)
    stores = await Stores.connect(blank_database)
    try:
        kinds = dict(
            await stores.database.pool.fetch(
                "SELECT relname, relkind::text FROM pg_class WHERE relname IN ('audit_log', 'audit_log_legacy')"
            )
        )
        assert kinds == {"audit_log": "p", "audit_log_legacy": "r"}
        await stores.database.pool.execute(
            "INSERT INTO audit_log (tenant_id, entity, entity_id, action, actor)"
            " VALUES ($1, 'execution', $2, 'finish', 'test')",
            TENANT,
            entity,
        )
        assert await trail(stores, entity) == ["dispatch", "start", "finish"]
        finish_id = await stores.database.pool.fetchval("SELECT max(id) FROM audit_log")
        assert finish_id > old_max
        # Keyset paging on the id goes on across the legacy rows and the new ones.
        page = await stores.audit.entries(TENANT, "execution", entity, after=old_max)
        assert [e.action for e in page] == ["finish"]
        # Rows written today are in the legacy partition (it covers every day up to tomorrow); from tomorrow on
        # they land in daily partitions, which exist a week ahead.
        tomorrow = datetime.now(UTC).date() + timedelta(days=1)
        assert day_name("audit_log", tomorrow + timedelta(days=1)) in await partition_names(stores, "audit_log")
        # The legacy partition goes once its newest day is past retention.
        later = midnight(tomorrow + timedelta(days=31))
        result = await PartitionLoop(
            stores.partitions, PartitionLoopConfig(retention_days=0, audit_retention_days=30), clock=FakeClock(later)
        ).run_once()
        assert "audit_log_legacy" not in await partition_names(stores, "audit_log")
        assert result.audit_dropped >= 1
        assert await trail(stores, entity) == []
    finally:
        await stores.close()

    await asyncio.to_thread(command.downgrade, alembic_config(blank_database), "0019")
    db = await asyncpg.connect(blank_database)
    try:
        assert await db.fetchval("SELECT relkind::text FROM pg_class WHERE relname = 'audit_log'") == "r"
        assert await db.fetchval("SELECT count(*) FROM audit_log") == 0
        # The identity goes on after the last id given (not from the rows retention left); append-only again.
        new = await db.fetchval(
            "INSERT INTO audit_log (tenant_id, entity, entity_id, action, actor)"
            " VALUES ($1, 'execution', $2, 'retry', 'test') RETURNING id",
            TENANT,
            entity,
        )
        assert new > finish_id
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await db.execute("DELETE FROM audit_log")
    finally:
        await db.close()
    await upgrade(blank_database)
