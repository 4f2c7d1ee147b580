"""The dispatchers' fair-pass census (``TenantStore.open_executions``): what it counts per tenant and pool, and that
it, and the sweeper's scans of every partition, reach the open rows through an index only (a bitmap scan revisits
every dead PENDING and RUNNING version at each read, bench/workloads/census.py) with a plan made once per connection."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import pytest
from sundial_common.stores import Stores
from sundial_common.stores.executions import Outcome
from sundial_common.stores.queries import load_file

from tests.integration.test_reliability import TENANT, make_executions


async def test_the_census_counts_waiting_running_and_open_executions_per_tenant_and_pool(stores: Stores) -> None:
    messages = await make_executions(stores, "census", "h", count=6)
    ids = [UUID(m.execution_id) for m in messages]
    started = await stores.executions.start_executions("w1", [(i, 1) for i in ids[:3]])
    assert len(started) == 3
    assert len(await stores.executions.finish_attempts("w1", [Outcome(ids[0], 1, "SUCCEEDED")])) == 1

    (row,) = [r for r in await stores.tenants.open_executions(3600.0, 3600.0) if r.pool == "census"]
    assert (row.tenant_id, row.pending, row.running, row.open, row.queued, row.fresh) == (TENANT, 3, 2, 5, 3, 3)
    assert row.waited_sec is not None and row.waited_sec >= 0
    # Dispatched longer ago than the windows (0 s): waiting still, no longer counted as queued or fresh.
    (old,) = [r for r in await stores.tenants.open_executions(0.0, 0.0) if r.pool == "census"]
    assert (old.pending, old.queued, old.fresh) == (3, 0, 0)


DATABASE, DISPATCH, EXECUTIONS, TENANTS = (
    load_file(f"{n}.sql") for n in ("database", "dispatch", "executions", "tenants")
)
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
#: The statements that read every partition (Database.fetch_every_partition), with arguments.
EVERY_PARTITION: dict[str, tuple[str, tuple[Any, ...]]] = {
    "census": (TENANTS["open_executions"], (30.0, 1.0)),
    "running": (EXECUTIONS["running_executions"], (EPOCH, UUID(int=0), 1000)),
    "dead letters": (EXECUTIONS["dead_letters"], (1000,)),
    "stale pending": (DISPATCH["stale_pending"], (datetime.now(UTC), datetime.now(UTC), 1000)),
    "published pools": (DISPATCH["published_pending_pools"], ()),
    "passed pending": (DISPATCH["passed_pending"], ("census", datetime.now(UTC), 1000)),
}


@pytest.mark.parametrize("statement", list(EVERY_PARTITION))
async def test_the_scans_of_every_partition_read_by_index_only_with_a_plan_kept(stores: Stores, statement: str) -> None:
    await make_executions(stores, "census", "h", count=3)
    await stores.database.pool.execute("ANALYZE executions")
    query, args = EVERY_PARTITION[statement]
    async with stores.database.pool.acquire() as conn, conn.transaction():
        await conn.execute(DATABASE["every_partition_plan"])
        plan = json.loads(await conn.fetchval("EXPLAIN (FORMAT JSON) " + query, *args))

    def scans(node: dict[str, object]) -> list[str]:
        children = node.get("Plans", [])
        assert isinstance(children, list)
        return [str(node["Node Type"])] + [s for child in children for s in scans(child)]

    found = [s for s in scans(plan[0]["Plan"]) if "Scan" in s and s != "Function Scan"]
    assert found and set(found) <= {"Index Scan", "Index Only Scan"}, found


async def test_an_execution_published_ahead_of_its_due_instant_is_open_but_not_waiting(stores: Stores) -> None:
    # Dispatched ahead (SUNDIAL_DISPATCHER_PUBLISH_LEAD_MS), it waits in a worker for its instant, not in the pool's
    # queue: its pool's cap and stall count only due work, its tenant's concurrency counts it.
    messages = await make_executions(stores, "census-ahead", "h", count=3)
    ahead = UUID(messages[0].execution_id)
    await stores.database.pool.execute(
        "UPDATE executions SET fire_at = now() + interval '1 hour' WHERE id = $1 AND id = $1", ahead
    )

    (row,) = [r for r in await stores.tenants.open_executions(3600.0, 3600.0) if r.pool == "census-ahead"]
    assert (row.pending, row.queued, row.fresh, row.open) == (2, 2, 2, 3)
