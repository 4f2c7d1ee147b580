"""Pools belong to tenants: the registry over HTTP, and every entry point of work refusing a pool the caller's
tenant may not use (403 naming the pool) or that is not registered (422 naming the field) — with nothing
written, row counts unchanged. Also: a shared pool admits exactly its listed tenants, jobs inherit the pool's
defaults, and the migration registers the pools existing jobs use."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from confluent_kafka.admin import AdminClient
from sundial_api.app import create_app
from sundial_api.settings import ApiSettings
from sundial_common.broker.messages import pool_topic
from sundial_common.security.auth import issue_token
from sundial_common.stores.schema import upgrade
from sundial_infra.stack import LocalStack

from tests.support.pools import admit, register_pool
from tests.support.tenants import tenant_token

SECRET = "pools-test-secret-0123456789abcdef01"
ADMIN = {"Authorization": f"Bearer {issue_token(SECRET, 'ops', admin=True)}"}
#: Every table a refused request must leave untouched.
TABLES = ("jobs", "executions", "audit_log", "replays", "idempotency_keys")


def job(pool: str, name: str = "j", **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": "DELAYED", "delaySeconds": 600, "target": {"pool": pool, "handler": "h"}, **extra}


@pytest.fixture
async def client(database_url: str, redis_url: str, kafka_bootstrap: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = ApiSettings(
        database_url=database_url, redis_url=redis_url, kafka_bootstrap=kafka_bootstrap, jwt_secret=SECRET, shards=2
    )
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api.test") as http,
    ):
        yield http


def bearer(database_url: str, tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tenant_token(database_url, tenant, secret=SECRET)}"}


async def counts(database_url: str) -> dict[str, int]:
    conn = await asyncpg.connect(database_url)
    try:
        present = {r["relname"] for r in await conn.fetch("SELECT relname FROM pg_class WHERE relkind = 'r'")}
        return {t: int(await conn.fetchval(f"SELECT count(*) FROM {t}")) for t in TABLES if t in present}
    finally:
        await conn.close()


def assert_forbidden(response: httpx.Response, pool: str) -> None:
    assert response.status_code == 403, response.text
    assert pool in response.json()["detail"] and response.json()["type"].endswith(":pool-forbidden")


async def test_tenant_b_sends_no_work_into_tenant_a_pools(client: httpx.AsyncClient, database_url: str) -> None:
    a, b = bearer(database_url, "tenant-a"), bearer(database_url, "tenant-b")
    admit(database_url, "a-work", "tenant-a")
    admit(database_url, "b-work", "tenant-b")
    admit(database_url, "a-staging", "tenant-a", kind="staging")
    # A job of B's in a pool A and B shared (before an operator gave the pool to A alone).
    admit(database_url, "was-shared", "tenant-a", "tenant-b")
    own = await client.post("/v1/jobs", json=job("b-work"), headers=b)
    legacy = await client.post("/v1/jobs", json=job("was-shared"), headers=b)
    assert own.status_code == legacy.status_code == 201, (own.text, legacy.text)
    regiven = await client.patch("/v1/admin/pools/was-shared", json={"owner": "tenant-a"}, headers=ADMIN)
    assert regiven.status_code == 200 and regiven.json()["sharedWith"] == [], regiven.text
    before = await counts(database_url)

    assert_forbidden(await client.post("/v1/jobs", json=job("a-work"), headers=b), "a-work")
    assert_forbidden(
        await client.post("/v1/jobs", json=job("a-work"), headers={**b, "Idempotency-Key": "k-1"}), "a-work"
    )
    batch = await client.post("/v1/jobs:batch", json={"jobs": [job("a-work"), job("nowhere")]}, headers=b)
    assert batch.status_code == 200 and batch.json()["created"] == 0, batch.text
    first, second = batch.json()["results"]
    assert first["status"] == 403 and "a-work" in first["problem"]["detail"]
    assert second["status"] == 422 and second["problem"]["errors"][0]["field"] == "target.pool"
    own_id = own.json()["jobId"]
    assert_forbidden(
        await client.patch(f"/v1/jobs/{own_id}", json={"target": {"pool": "a-work", "handler": "h"}}, headers=b),
        "a-work",
    )
    assert_forbidden(await client.post(f"/v1/jobs/{legacy.json()['jobId']}/trigger", headers=b), "was-shared")
    now = datetime.now(UTC)
    replay = {
        "sourcePool": "b-work",
        "targetPool": "a-staging",
        "from": (now - timedelta(minutes=5)).isoformat(),
        "to": (now - timedelta(minutes=1)).isoformat(),
    }
    assert_forbidden(await client.post("/v1/replays", json=replay, headers=b), "a-staging")
    assert await counts(database_url) == before  # nothing written: no job, execution, audit row or replay
    current = (await client.get(f"/v1/jobs/{own_id}", headers=b)).json()
    assert current["target"]["pool"] == "b-work" and current["version"] == 1

    unregistered = await client.post("/v1/jobs", json=job("nowhere"), headers=b)
    assert unregistered.status_code == 422 and unregistered.json()["errors"][0]["field"] == "target.pool"
    into_production = await client.post("/v1/replays", json={**replay, "targetPool": "b-work"}, headers=b)
    assert into_production.status_code == 422 and into_production.json()["errors"][0]["field"] == "targetPool"
    assert await counts(database_url) == before

    # A's own work is accepted everywhere B's was refused.
    assert (await client.post("/v1/jobs", json=job("a-work"), headers=a)).status_code == 201
    assert (await client.post(f"/v1/jobs/{legacy.json()['jobId']}/trigger", headers=a)).status_code == 404


async def test_a_staging_pool_takes_no_job_only_replays(client: httpx.AsyncClient, database_url: str) -> None:
    # A staging pool's workers run replayed messages only (sundial_worker.staging): a job's execution there would
    # be skipped as "not a replayed message" and stay PENDING for ever.
    a = bearer(database_url, "tenant-a")
    admit(database_url, "a-work", "tenant-a")
    admit(database_url, "a-staging", "tenant-a", kind="staging")
    own = await client.post("/v1/jobs", json=job("a-work"), headers=a)
    assert own.status_code == 201, own.text
    own_id = own.json()["jobId"]
    before = await counts(database_url)

    refusals = [
        await client.post("/v1/jobs", json=job("a-staging"), headers=a),
        await client.post("/v1/jobs", json=job("a-staging"), headers={**a, "Idempotency-Key": "k-staging"}),
        await client.patch(f"/v1/jobs/{own_id}", json={"target": {"pool": "a-staging", "handler": "h"}}, headers=a),
    ]
    for refused in refusals:
        assert refused.status_code == 422, refused.text
        assert refused.json()["errors"][0]["field"] == "target.pool" and "staging" in refused.json()["detail"]
    batch = await client.post("/v1/jobs:batch", json={"jobs": [job("a-staging"), job("a-work")]}, headers=a)
    assert batch.status_code == 200 and batch.json()["created"] == 1, batch.text
    first = batch.json()["results"][0]
    assert first["status"] == 422 and first["problem"]["errors"][0]["field"] == "target.pool"
    after = await counts(database_url)
    assert after["jobs"] == before["jobs"] + 1  # the batch's job in `a-work`; nothing else was written
    assert {t: n for t, n in after.items() if t not in ("jobs", "audit_log")} == {
        t: n for t, n in before.items() if t not in ("jobs", "audit_log")
    }
    assert (await client.get(f"/v1/jobs/{own_id}", headers=a)).json()["target"]["pool"] == "a-work"

    # Still a replay's target, for the tenant's own messages (test_replays.py replays into one with a tenant's token).
    now = datetime.now(UTC)
    replay = {
        "sourcePool": "a-work",
        "targetPool": "a-staging",
        "from": (now - timedelta(minutes=5)).isoformat(),
        "to": (now - timedelta(minutes=1)).isoformat(),
    }
    into_staging = await client.post("/v1/replays", json=replay, headers=a)
    # The target passes its check; what stops this one is its source (a-work never had a message, nor a topic).
    assert into_staging.status_code == 404 and pool_topic("a-work") in into_staging.json()["detail"], into_staging.text


async def test_a_pool_does_not_turn_staging_while_jobs_that_can_still_fire_target_it(
    client: httpx.AsyncClient, database_url: str
) -> None:
    a = bearer(database_url, "tenant-a")
    admit(database_url, "a-work", "tenant-a")
    created = await client.post("/v1/jobs", json=job("a-work"), headers=a)
    assert created.status_code == 201, created.text

    flipped = await client.patch("/v1/admin/pools/a-work", json={"kind": "staging"}, headers=ADMIN)
    assert flipped.status_code == 409, flipped.text
    assert flipped.json()["errors"][0]["field"] == "kind" and "1 active jobs" in flipped.json()["detail"]
    pool = (await client.get("/v1/admin/pools/a-work", headers=ADMIN)).json()
    assert (pool["kind"], pool["version"]) == ("production", 1), "nothing written"
    # Other changes go through as before, and once the job is cancelled the pool may turn staging.
    shared = await client.patch("/v1/admin/pools/a-work", json={"defaultTimeoutSec": 9}, headers=ADMIN)
    assert shared.status_code == 200, shared.text
    cancelled = await client.delete(f"/v1/jobs/{created.json()['jobId']}", headers=a)
    assert cancelled.status_code == 200, cancelled.text
    flipped = await client.patch("/v1/admin/pools/a-work", json={"kind": "staging"}, headers=ADMIN)
    assert flipped.status_code == 200 and flipped.json()["kind"] == "staging", flipped.text


async def test_a_shared_pool_admits_exactly_its_listed_tenants(client: httpx.AsyncClient, database_url: str) -> None:
    tokens = {t: bearer(database_url, t) for t in ("left", "right", "outsider")}
    created = await client.post(
        "/v1/admin/pools",
        json={"name": f"shared-{uuid.uuid4().hex[:6]}", "sharedWith": ["left", "right"]},
        headers=ADMIN,
    )
    assert created.status_code == 201, created.text
    name = created.json()["name"]
    assert created.json()["owner"] is None and created.json()["sharedWith"] == ["left", "right"]
    for tenant in ("left", "right"):
        assert (await client.post("/v1/jobs", json=job(name), headers=tokens[tenant])).status_code == 201
    assert_forbidden(await client.post("/v1/jobs", json=job(name), headers=tokens["outsider"]), name)
    for tenant, visible in (("left", [name]), ("outsider", [])):
        mine = await client.get("/v1/pools", headers=tokens[tenant])
        assert [p["name"] for p in mine.json()["items"]] == visible
    # A tenant sees that a pool is shared, not with whom.
    assert (await client.get("/v1/pools", headers=tokens["right"])).json()["items"][0]["sharedWith"] == ["right"]

    # Re-shared to `right` alone: `left` is refused from the next request on (this replica's cache is refreshed).
    assert (await client.patch(f"/v1/admin/pools/{name}", json={"sharedWith": ["right"]}, headers=ADMIN)).is_success
    assert_forbidden(await client.post("/v1/jobs", json=job(name), headers=tokens["left"]), name)
    assert (await client.post("/v1/jobs", json=job(name), headers=tokens["right"])).status_code == 201


async def test_the_registry_endpoints(client: httpx.AsyncClient, database_url: str, kafka_bootstrap: str) -> None:
    acme = bearer(database_url, "acme")
    name = f"email-{uuid.uuid4().hex[:6]}"
    body = {
        "name": name,
        "owner": "acme",
        "partitions": 2,
        "retentionMs": 3_600_000,
        "defaultTimeoutSec": 42,
        "defaultRetryPolicy": {"maxAttempts": 7, "backoff": "FIXED", "initialDelayMs": 1000},
    }
    assert (await client.post("/v1/admin/pools", json=body, headers=acme)).status_code == 403  # not an admin
    created = await client.post("/v1/admin/pools", json=body, headers=ADMIN)
    assert created.status_code == 201 and created.headers["Location"] == f"/v1/admin/pools/{name}", created.text
    assert created.json()["kind"] == "production" and created.json()["partitions"] == 2
    topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert len(topics[pool_topic(name)].partitions) == 2  # creating the pool created its topic
    again = await client.post("/v1/admin/pools", json=body, headers=ADMIN)
    assert again.status_code == 409 and again.json()["errors"][0]["field"] == "name"
    both = await client.post(
        "/v1/admin/pools", json={"name": "x", "owner": "acme", "sharedWith": ["acme"]}, headers=ADMIN
    )
    assert both.status_code == 422 and both.json()["errors"][0]["field"] == "owner"
    stranger = await client.post("/v1/admin/pools", json={"name": "y", "owner": "nobody"}, headers=ADMIN)
    assert stranger.status_code == 422 and stranger.json()["errors"][0]["field"] == "owner"
    bad_name = await client.post("/v1/admin/pools", json={"name": "Bad Pool", "owner": "acme"}, headers=ADMIN)
    assert bad_name.status_code == 422 and bad_name.json()["errors"][0]["field"] == "name"

    # A job inherits the pool's defaults where it gives none, and keeps its own where it does.
    inherited = await client.post("/v1/jobs", json=job(name), headers=acme)
    assert inherited.status_code == 201, inherited.text
    assert inherited.json()["timeoutSec"] == 42 and inherited.json()["retryPolicy"]["maxAttempts"] == 7
    own = await client.post("/v1/jobs", json=job(name, timeoutSec=5, retryPolicy={"maxAttempts": 2}), headers=acme)
    assert own.json()["timeoutSec"] == 5 and own.json()["retryPolicy"]["maxAttempts"] == 2

    shown = await client.get(f"/v1/admin/pools/{name}", headers=ADMIN)
    assert shown.json()["defaultRetryPolicy"]["maxAttempts"] == 7 and shown.headers["ETag"] == '"1"'
    stale = await client.patch(
        f"/v1/admin/pools/{name}", json={"kind": "staging"}, headers={**ADMIN, "If-Match": '"9"'}
    )
    assert stale.status_code == 412
    listed = await client.get("/v1/admin/pools", headers=ADMIN)
    assert [p["name"] for p in listed.json()["items"]] == [name] and listed.json()["nextCursor"] is None

    busy = await client.delete(f"/v1/admin/pools/{name}", headers=ADMIN)
    assert busy.status_code == 409 and "2 active jobs" in busy.json()["detail"]
    for created_job in (inherited, own):
        assert (await client.delete(f"/v1/jobs/{created_job.json()['jobId']}", headers=acme)).status_code == 200
    assert (await client.delete(f"/v1/admin/pools/{name}", headers=ADMIN)).status_code == 204
    assert (await client.get(f"/v1/admin/pools/{name}", headers=ADMIN)).status_code == 404
    gone = await client.post("/v1/jobs", json=job(name), headers=acme)
    assert gone.status_code == 422 and gone.json()["errors"][0]["field"] == "target.pool"

    paths = (await client.get("/openapi.json")).json()["paths"]
    assert {"/v1/admin/pools", "/v1/admin/pools/{name}", "/v1/pools"} <= paths.keys()


async def test_the_migration_registers_the_pools_existing_jobs_use(stack: LocalStack) -> None:
    name = f"m_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(stack.postgres_dsn)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    dsn = stack.postgres.dsn_for(name)
    try:
        await upgrade(dsn, "0011")
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("INSERT INTO tenants (id) VALUES ('solo'), ('one'), ('two')")
            for tenant, pool in (("solo", "reports"), ("one", "email"), ("two", "email"), ("solo", "staging-x")):
                await conn.execute(
                    "INSERT INTO jobs (id, tenant_id, name, type, pool, handler, timeout_sec, state, shard) "
                    "VALUES ($1, $2, 'j', 'DELAYED', $3, 'h', 30, 'ACTIVE', 0)",
                    uuid.uuid4(),
                    tenant,
                    pool,
                )
            await upgrade(dsn, "head")
            rows = await conn.fetch("SELECT name, owner, shared_with, kind FROM pools ORDER BY name")
        finally:
            await conn.close()
    finally:
        admin = await asyncpg.connect(stack.postgres_dsn)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            await admin.close()
    assert [tuple(r) for r in rows] == [
        ("email", None, ["one", "two"], "production"),
        ("reports", "solo", [], "production"),
        ("staging-x", "solo", [], "staging"),
    ]


async def test_register_pool_helper_writes_an_exact_entry(database_url: str) -> None:
    await register_pool(database_url, "exact", shared_with=["p", "q"], kind="staging", default_timeout_sec=9)
    conn = await asyncpg.connect(database_url)
    try:
        row = await conn.fetchrow(
            "SELECT owner, shared_with, kind, default_timeout_sec FROM pools WHERE name = 'exact'"
        )
    finally:
        await conn.close()
    assert tuple(row) == (None, ["p", "q"], "staging", 9)
