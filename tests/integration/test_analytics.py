"""The ClickHouse replica on real Postgres and the embedded chDB engine: lifecycle events from the triggers,
the ingester's batches (idempotent when re-sent), the stats queries, and Postgres retention.

chDB opens one data directory per process, so the session shares one directory and each test gets a
ClickHouse database of its own.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sundial_analytics.http import create_app
from sundial_analytics.ingest import IngestConfig, Ingester, Retention, RetentionConfig, error_class, replica_row
from sundial_analytics.replica import ClickHouseReplica, ReplicaConfig
from sundial_common.clock import SystemClock
from sundial_common.stores import Stores
from sundial_common.stores.executions import Outcome

from tests.integration.test_reliability import TENANT, make_executions


@pytest.fixture(scope="session")
def chdb_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chdb")


@pytest.fixture(scope="session")
def _session_replica(chdb_path: Path) -> Iterator[ClickHouseReplica]:
    replica = ClickHouseReplica(ReplicaConfig(url=None, chdb_path=chdb_path, database="probe"))
    yield replica
    replica.close()


@pytest.fixture
async def replica(chdb_path: Path, _session_replica: ClickHouseReplica) -> AsyncIterator[ClickHouseReplica]:
    # The session's engine stays open (chDB cannot switch directories in one process); each test gets a
    # database of its own on it.
    replica = ClickHouseReplica(ReplicaConfig(url=None, chdb_path=chdb_path, database=f"t_{uuid.uuid4().hex[:8]}"))
    await replica.ensure_schema()
    yield replica
    replica.close()


async def postgres_counts(stores: Stores) -> Counter[tuple[str, str, str]]:
    rows = await stores.database.pool.fetch(
        "SELECT tenant_id, state, (scheduled_for AT TIME ZONE 'UTC')::date AS day, count(*) AS n FROM executions"
        " GROUP BY 1, 2, 3"
    )
    return Counter({(r["tenant_id"], r["state"], r["day"].isoformat()): r["n"] for r in rows})


async def replica_counts(replica: ClickHouseReplica) -> Counter[tuple[str, str, str]]:
    return Counter(
        {(r["tenant_id"], r["state"], r["day"].isoformat()): r["executions"] for r in await replica.state_counts()}
    )


async def outbox(stores: Stores) -> list[tuple[str, str, int]]:
    rows = await stores.database.pool.fetch("SELECT kind, state, attempt FROM execution_events ORDER BY id")
    return [(r["kind"], r["state"], r["attempt"]) for r in rows]


async def run_lifecycle(stores: Stores) -> dict[str, Any]:
    """Five executions: one succeeds, one fails and is retried then dies, one is cancelled, two stay pending."""
    pool = f"a-{uuid.uuid4().hex[:8]}"
    ok, flaky, cancelled, *_ = messages = await make_executions(
        stores, pool, "work", 5, retry_policy={"maxAttempts": 2, "backoff": "FIXED", "initialDelayMs": 1}
    )
    ids = [uuid.UUID(m.execution_id) for m in messages]
    await stores.executions.start_executions("w1", [(ids[0], 1), (ids[1], 1)])
    await stores.executions.finish_attempts(
        "w1",
        [
            Outcome(ids[0], 1, "SUCCEEDED", result={"ok": True}),
            Outcome(ids[1], 1, "FAILED", error="ValueError: boom", retry_delay_ms=1),
        ],
    )
    await stores.database.pool.execute(
        "UPDATE executions SET state = 'PENDING', attempt = 2, next_attempt_at = NULL WHERE id = $1", ids[1]
    )
    await stores.executions.start_executions("w2", [(ids[1], 2)])
    await stores.executions.finish_attempts("w2", [Outcome(ids[1], 2, "FAILED", error="ValueError: again")])
    assert await stores.executions.cancel_execution(TENANT, ids[2], "test") is not None
    return {"pool": pool, "ids": ids, "messages": (ok, flaky, cancelled)}


async def test_every_state_change_queues_one_lifecycle_event_in_its_transaction(stores: Stores) -> None:
    await run_lifecycle(stores)
    kinds = Counter(kind for kind, _state, _attempt in await outbox(stores))
    assert kinds == Counter(
        {"created": 5, "started": 3, "finished": 1, "retried": 1, "requeued": 1, "dead_lettered": 1, "cancelled": 1}
    )
    # Publishing (published_at) changes no state: no event.
    await stores.database.pool.execute("UPDATE executions SET published_at = now()")
    assert sum(Counter(k for k, _s, _a in await outbox(stores)).values()) == 13


async def test_the_replica_converges_to_postgres_and_a_resent_batch_changes_no_count(
    stores: Stores, replica: ClickHouseReplica
) -> None:
    await run_lifecycle(stores)
    ingester = Ingester(stores.analytics, replica, IngestConfig(batch_size=4))
    # An ingester killed between its insert and its delete: the same batch goes in twice.
    events = await stores.analytics.oldest_events(100)
    await replica.insert([replica_row(e, None) for e in events])
    passes = 0
    while (await ingester.run_once()).events:
        passes += 1
    assert passes == 4  # 13 events, 4 per batch
    assert await stores.analytics.pending_events() == 0
    assert await replica_counts(replica) == await postgres_counts(stores)
    assert sum((await replica_counts(replica)).values()) == 5


async def test_stats_answer_counts_failure_rate_and_percentiles_per_group(
    stores: Stores, replica: ClickHouseReplica
) -> None:
    lifecycle = await run_lifecycle(stores)
    await Ingester(stores.analytics, replica, IngestConfig()).run_once()
    now = datetime.now(UTC)
    query = {
        "tenant": TENANT,
        "from": (now - timedelta(hours=1)).isoformat(),
        "to": (now + timedelta(hours=1)).isoformat(),
    }
    transport = httpx.ASGITransport(app=create_app(replica))
    async with httpx.AsyncClient(transport=transport, base_url="http://analytics") as http:
        by_state = (await http.get("/stats/executions", params={**query, "interval": "day", "groupBy": "state"})).json()
        handlers = (await http.get("/stats/handlers", params=query)).json()
        other = (await http.get("/stats/executions", params={**query, "tenant": "someone-else"})).json()
        found = (await http.get(f"/executions/{lifecycle['ids'][1]}", params={"tenant": TENANT})).json()
    groups = {item["group"]: item["executions"] for item in by_state["items"]}
    assert groups == {"SUCCEEDED": 1, "DEAD": 1, "CANCELLED": 1, "PENDING": 2}
    [handler] = handlers["mostFailing"]
    assert (handler["pool"], handler["handler"], handler["failed"], handler["failureRate"]) == (
        lifecycle["pool"],
        "work",
        1,
        0.5,
    )
    assert handler["topErrorClass"] == "ValueError"
    assert handlers["slowest"][0]["durationMs"]["p50"] is not None
    assert other == {"items": []}
    assert (found["state"], found["attempt"]) == ("DEAD", 2)


async def test_retention_deletes_finished_executions_only_once_their_events_reached_clickhouse(
    stores: Stores, replica: ClickHouseReplica
) -> None:
    lifecycle = await run_lifecycle(stores)

    class Later(SystemClock):
        def now(self) -> datetime:
            return datetime.now(UTC) + timedelta(days=31)

    retention = Retention(stores.analytics, RetentionConfig(days=30), clock=Later())
    # Events still queued: nothing may leave Postgres yet.
    assert (await retention.run_once()).expired == 0
    await Ingester(stores.analytics, replica, IngestConfig()).run_once()
    assert (await retention.run_once()).expired == 2  # succeeded, cancelled; the pending two stay
    # A dead letter stays until the sweeper has published it to sundial.dlq.
    await stores.executions.mark_dead_lettered([lifecycle["ids"][1]])
    assert (await retention.run_once()).expired == 1
    states = sorted(r["state"] for r in await stores.database.pool.fetch("SELECT state FROM executions"))
    assert states == ["PENDING", "PENDING"]
    assert await stores.database.pool.fetchval("SELECT count(*) FROM execution_attempts") == 0
    # ClickHouse still has all five.
    assert sum((await replica_counts(replica)).values()) == 5


def test_error_class_is_the_exception_name_or_a_generic_one() -> None:
    assert error_class("ValueError: boom") == "ValueError"
    assert error_class("requests.exceptions.Timeout: read") == "requests.exceptions.Timeout"
    assert error_class("cancelled: a newer occurrence started") == "cancelled"
    assert error_class("the handler vanished") == "Error"
    assert error_class(None) == ""
