"""The ClickHouse replica on real Postgres and the embedded chDB engine: lifecycle events from the triggers,
the ingester's batches (idempotent when re-sent), the stats queries, and Postgres retention.

chDB opens one data directory per process, so the session shares one directory and each test gets a
ClickHouse database of its own.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from prometheus_client import REGISTRY
from sundial_analytics.cli import serve_stats
from sundial_analytics.http import create_app
from sundial_analytics.ingest import FINAL_KINDS, IngestConfig, Ingester
from sundial_analytics.replica import EVENT_COLUMNS, ClickHouseReplica, ReplicaConfig
from sundial_analytics.settings import AnalyticsSettings
from sundial_common.stores import Stores
from sundial_common.stores.executions import Outcome
from sundial_infra.stack import TEST_PORTS

from tests.integration.test_reliability import TENANT, make_executions
from tests.support.api import Api, api
from tests.support.ports import port_offset
from tests.support.worker import wait_until

__all__ = ["api"]  # the fixture


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

    # An ingester killed between its insert and its commit: the batch stays queued and goes in again.
    class Killed(Exception):
        pass

    async def insert_then_die(rows: bytes) -> None:
        await replica.insert(rows)
        raise Killed

    with pytest.raises(Killed):
        await stores.analytics.take_events(100, insert_then_die)
    assert await stores.analytics.pending_events() == 13
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


_ERROR_CLASS = re.compile(r"^([A-Za-z_][\w.]{0,99})(?::|$)")


def _ms(later: datetime | None, earlier: datetime | None) -> int | None:
    if later is None or earlier is None:
        return None
    return max(0, int((later - earlier).total_seconds() * 1000))


def expected_row(event: asyncpg.Record, first_start: datetime | None) -> tuple[Any, ...]:
    """What the replica must hold for one outbox row, computed in Python from the row as Postgres has it."""
    fire_at = event["fire_at"] or event["scheduled_for"]
    started = first_start if event["attempt"] > 1 else event["started_at"]
    error = event["error"]
    match = _ERROR_CLASS.match(error) if error else None
    return (
        event["id"],
        event["at"],
        event["kind"],
        event["tenant_id"],
        event["job_id"],
        event["execution_id"],
        event["attempt"],
        event["state"],
        event["pool"],
        event["handler"],
        event["scheduled_for"],
        fire_at,
        event["created_at"],
        event["started_at"],
        event["finished_at"],
        _ms(started, fire_at),
        _ms(event["finished_at"], event["started_at"]),
        event["worker_id"] or "",
        (match.group(1) if match else "Error") if error else "",
    )


def _to_ms(value: Any) -> Any:
    """ClickHouse keeps milliseconds (DateTime64(3)): a Postgres time truncated to them."""
    if isinstance(value, datetime):
        return value.replace(microsecond=value.microsecond // 1000 * 1000).astimezone(UTC)
    return value


async def test_the_replica_holds_each_events_values_as_postgres_had_them(
    stores: Stores, replica: ClickHouseReplica
) -> None:
    lifecycle = await run_lifecycle(stores)
    # Edge cases beside the lifecycle's own events: error texts, a time whose milliseconds a float loses
    # (1.001 s), microseconds to truncate, no fire time, no worker, a tab and a newline in a text.
    base = datetime(2026, 11, 26, 12, 0, 0, 123999, tzinfo=UTC)
    errors = [
        "ValueError: boom",
        "requests.exceptions.Timeout: read",
        "cancelled: a newer occurrence started",
        "the handler vanished",
        "Bare",
        "Trailing\n",
        "Trailing\nmore",
        "_private.Name: x",
        "9Lives: x",
        "x" * 100 + ": too long",
        "y" * 99 + ": long enough",
        "",
        None,
    ]
    for i, error in enumerate(errors):
        await stores.database.pool.execute(
            "INSERT INTO execution_events (kind, execution_id, tenant_id, job_id, attempt, state, pool, handler,"
            " scheduled_for, fire_at, created_at, started_at, finished_at, worker_id, error)"
            " VALUES ('finished', $1, $2, $3, 1, 'FAILED', $4, $5, $6, $7, $6, $8, $9, $10, $11)",
            uuid.uuid4(),
            TENANT,
            uuid.uuid4(),
            lifecycle["pool"],
            "h\tandler" if i == 0 else "work",
            base,
            None if i % 2 else base + timedelta(milliseconds=i),
            base + timedelta(milliseconds=1001 + i),
            base + timedelta(seconds=i, microseconds=290_001),
            None if i == 1 else f"worker-{i}",
            error,
        )
    events = await stores.database.pool.fetch("SELECT * FROM execution_events ORDER BY id")
    first_starts = {
        r["execution_id"]: r["started_at"]
        for r in await stores.database.pool.fetch(
            "SELECT execution_id, started_at FROM execution_attempts WHERE attempt = 1"
        )
    }
    observed = REGISTRY.get_sample_value("sundial_analytics_replication_lag_seconds_count") or 0.0
    while (await Ingester(stores.analytics, replica, IngestConfig(batch_size=7)).run_once()).events:
        pass
    # The replication lag is observed once per final event.
    finals = sum(e["kind"] in FINAL_KINDS for e in events)
    assert REGISTRY.get_sample_value("sundial_analytics_replication_lag_seconds_count") == observed + finals
    columns = ", ".join(EVENT_COLUMNS)
    rows = await replica._rows(
        f"SELECT {columns} FROM {replica.config.database}.execution_events ORDER BY event_id", {}
    )
    got = [tuple(_to_ms(row[c]) for c in EVENT_COLUMNS) for row in rows]
    want = [tuple(_to_ms(v) for v in expected_row(e, first_starts.get(e["execution_id"]))) for e in events]
    assert got == want
    assert {row[-1] for row in got} >= {"ValueError", "requests.exceptions.Timeout", "Error", "Bare", "Trailing", ""}


# --- the API's /v1/stats and the 410 of an execution gone from Postgres ------------------------------

STATS_PORT = TEST_PORTS.api + 44 + port_offset()
STATS_URL = f"http://127.0.0.1:{STATS_PORT}"


@pytest.fixture
async def stats_endpoint(replica: ClickHouseReplica) -> AsyncIterator[ClickHouseReplica]:
    """The analytics service's loopback endpoint over this test's replica, as the API reaches it."""
    until = asyncio.Event()
    settings = AnalyticsSettings(analytics_port=STATS_PORT)
    server = asyncio.create_task(serve_stats(until, replica, settings))

    async def up() -> bool:
        try:
            async with httpx.AsyncClient() as http:
                return (await http.get(f"{STATS_URL}/healthz")).status_code == 200
        except httpx.HTTPError:
            return False

    await wait_until(up, "the stats endpoint to listen", 10)
    yield replica
    until.set()
    await server


@pytest.mark.parametrize(
    ("query", "fields"),
    [
        ({"interval": "week"}, ["interval"]),
        ({"groupBy": "colour", "from": "yesterday"}, ["groupBy", "from"]),
        ({"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, ["to"]),
        ({"from": "2020-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z", "interval": "hour"}, ["from"]),
    ],
)
async def test_bad_stats_parameters_are_a_422_naming_each(api: Api, query: dict[str, str], fields: list[str]) -> None:
    answer = await api.client.get("/v1/stats/executions", params=query, headers=api.auth())
    assert answer.status_code == 422, answer.text
    assert [error["field"] for error in answer.json()["errors"]] == fields, answer.text


@pytest.mark.parametrize("api", [{"analytics_url": STATS_URL, "execution_retention_days": 0.5}], indirect=True)
async def test_the_api_answers_the_tenants_stats_from_the_replica_and_410_for_an_expired_execution(
    api: Api, stats_endpoint: ClickHouseReplica, stores: Stores
) -> None:
    lifecycle = await run_lifecycle(stores)
    await Ingester(stores.analytics, stats_endpoint, IngestConfig()).run_once()
    now = datetime.now(UTC)
    window = {"from": (now - timedelta(hours=2)).isoformat(), "to": (now + timedelta(hours=1)).isoformat()}
    answer = await api.client.get("/v1/stats/executions", params={**window, "groupBy": "state"}, headers=api.auth())
    assert answer.status_code == 200, answer.text
    assert {item["group"]: item["executions"] for item in answer.json()["items"]} == {
        "SUCCEEDED": 1,
        "DEAD": 1,
        "CANCELLED": 1,
        "PENDING": 2,
    }
    handlers = await api.client.get("/v1/stats/handlers", params=window, headers=api.auth())
    assert handlers.json()["mostFailing"][0]["failureRate"] == 0.5
    elsewhere = await api.client.get("/v1/stats/executions", params=window, headers=api.auth("globex"))
    assert elsewhere.json()["items"] == []

    # The API's clock is a day ahead: with 12 h of retention these executions are past it. One deleted
    # from Postgres is a 410 saying where it went; another tenant asking gets the plain 404.
    dead = lifecycle["ids"][1]
    await stores.database.pool.execute("DELETE FROM execution_attempts WHERE execution_id = $1", dead)
    await stores.database.pool.execute("DELETE FROM executions WHERE id = $1", dead)
    gone = await api.client.get(f"/v1/executions/{dead}", headers=api.auth())
    assert gone.status_code == 410, gone.text
    assert "ended DEAD after 2 attempt(s)" in gone.json()["detail"]
    assert "/v1/stats/executions?" in gone.headers["Link"]
    assert (await api.client.get(f"/v1/executions/{dead}", headers=api.auth("globex"))).status_code == 404


async def test_an_execution_waiting_for_its_retry_is_open_not_failed(
    stores: Stores, replica: ClickHouseReplica
) -> None:
    [message] = await make_executions(
        stores, f"a-{uuid.uuid4().hex[:8]}", "work", retry_policy={"maxAttempts": 3, "backoff": "FIXED"}
    )
    ident = uuid.UUID(message.execution_id)
    await stores.executions.start_executions("w1", [(ident, 1)])
    await stores.executions.finish_attempts("w1", [Outcome(ident, 1, "FAILED", error="E: x", retry_delay_ms=60_000)])
    await Ingester(stores.analytics, replica, IngestConfig()).run_once()
    now = datetime.now(UTC)
    [item] = await replica.execution_stats(TENANT, now - timedelta(hours=1), now + timedelta(hours=1), "day", None)
    assert (item["executions"], item["failed"], item["open"]) == (1, 0, 1)
