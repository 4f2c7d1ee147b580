"""``GET /v1/admin/cluster`` on real etcd, Postgres and Redis: admin-only, and it tells the cluster's truth."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import aetcd
import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis
from sundial_api import ApiSettings, create_app
from sundial_api.admin import register_replica
from sundial_common.coordination.leadership import LeadershipConfig, ShardLeadership
from sundial_common.coordination.registry import ClusterKeys, ReplicaRecord, ReplicaRegistration
from sundial_common.hotwindow.window import HotWindow
from sundial_common.security.auth import issue_token
from sundial_common.stores.types import Occurrence

from tests.support.tenants import tenant_token

SECRET = "admin-test-signing-key-of-32-bytes-at-least"
SHARDS = 4


def settings_for(database_url: str, redis_url: str, etcd_endpoint: str) -> ApiSettings:
    return ApiSettings(
        database_url=database_url,
        redis_url=redis_url,
        etcd_endpoint=etcd_endpoint,
        jwt_secret=SECRET,
        shards=SHARDS,
        instance_id="api-under-test",
        lease_ttl_sec=2.0,
        lease_margin_sec=0.5,
    )


async def serve(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api.test") as client,
    ):
        yield client


def bearer(*, admin: bool) -> dict[str, str]:
    return {"Authorization": f"Bearer {issue_token(SECRET, 'ops', admin=admin)}"}


@pytest.fixture
async def etcd(etcd_endpoint: str) -> AsyncIterator[aetcd.Client]:
    host, port = etcd_endpoint.rsplit(":", 1)
    async with aetcd.Client(host=host, port=int(port)) as client:
        yield client


async def test_the_cluster_view_needs_an_admin_token(database_url: str, redis_url: str, etcd_endpoint: str) -> None:
    app = create_app(settings_for(database_url, redis_url, etcd_endpoint))
    async for client in serve(app):
        anonymous = await client.get("/v1/admin/cluster")
        assert anonymous.status_code == 401
        tenant = await client.get("/v1/admin/cluster", headers=bearer(admin=False))
        assert tenant.status_code == 403
        assert tenant.headers["content-type"] == "application/problem+json"
        assert "admin token" in tenant.json()["detail"]
        assert (await client.get("/v1/admin/cluster", headers=bearer(admin=True))).status_code == 200


async def test_the_cluster_view_shows_replicas_leaders_fences_leases_and_hot_windows(
    database_url: str, redis_url: str, etcd_endpoint: str, etcd: aetcd.Client
) -> None:
    keys = ClusterKeys()
    dispatcher = ReplicaRegistration(etcd, ReplicaRecord.for_this_process("dispatcher", "disp-1"), ttl_sec=2.0)
    await dispatcher.register()
    leadership = ShardLeadership(
        etcd, 2, "disp-1", LeadershipConfig(ttl_sec=2.0, margin_sec=0.5, key_prefix=keys.shard_prefix)
    )
    hydrator_lead = ShardLeadership(
        etcd, 0, "hyd-1", LeadershipConfig(ttl_sec=2.0, margin_sec=0.5, key_prefix=keys.role_prefix("hydrator"))
    )
    await ReplicaRegistration(etcd, ReplicaRecord.for_this_process("hydrator", "hyd-1"), ttl_sec=2.0).register()
    redis = Redis.from_url(redis_url)
    db = await asyncpg.connect(database_url)
    try:
        await leadership.acquire()
        await hydrator_lead.acquire()
        soon = datetime.now(UTC) + timedelta(minutes=5)
        await HotWindow(redis).add(2, [Occurrence(uuid.uuid4(), soon), Occurrence(uuid.uuid4(), soon)])
        # The previous term's token: disp-1 has been elected but has not taken the shard in Postgres yet.
        await db.execute("INSERT INTO shard_fence (shard, token, holder) VALUES (2, 41, 'disp-0')")

        app = create_app(settings_for(database_url, redis_url, etcd_endpoint))
        register_replica(app)
        async for client in serve(app):
            # The API replica registers in the background; wait for it to show up.
            for _ in range(100):
                body = (await client.get("/v1/admin/cluster", headers=bearer(admin=True))).json()
                if any(r["kind"] == "api" for r in body["replicas"]):
                    break
                await asyncio.sleep(0.05)
    finally:
        await leadership.stop()
        await hydrator_lead.stop()
        await dispatcher.deregister()
        await redis.aclose()
        await db.close()

    assert body["shardCount"] == SHARDS and body["errors"] == {}
    replicas = {r["id"]: r for r in body["replicas"]}
    assert set(replicas) == {"disp-1", "hyd-1", "api-under-test"}
    assert replicas["disp-1"]["kind"] == "dispatcher" and replicas["disp-1"]["leadsShards"] == [2]
    assert replicas["hyd-1"]["roles"] == ["hydrator"]
    assert replicas["api-under-test"]["kind"] == "api" and replicas["api-under-test"]["pid"] > 0
    for replica in replicas.values():
        assert replica["startedAt"] <= replica["lastHeartbeatAt"]

    shards = {s["shard"]: s for s in body["shards"]}
    assert sorted(shards) == [0, 1, 2, 3]
    assert shards[2]["leader"] == "disp-1" and shards[2]["fenceToken"] is None, "the new leader has no token yet"
    assert shards[2]["recordedFence"] == 41
    assert 0 <= shards[2]["leaseTtlSec"] <= 2
    assert shards[2]["hotWindowSize"] == 2
    assert shards[0] == {
        "shard": 0,
        "leader": None,
        "fenceToken": None,
        "recordedFence": None,
        "leaseTtlSec": None,
        "hotWindowSize": 0,
        "handoverTo": None,
    }
    roles = {r["role"]: r for r in body["roles"]}
    assert roles["hydrator"]["leader"] == "hyd-1" and roles["sweeper"]["leader"] is None


async def test_the_api_leaves_the_registry_when_it_stops(
    database_url: str, redis_url: str, etcd_endpoint: str, etcd: aetcd.Client
) -> None:
    app = create_app(settings_for(database_url, redis_url, etcd_endpoint))
    register_replica(app)
    key = ClusterKeys().replica("api", "api-under-test")
    async for _client in serve(app):
        for _ in range(100):
            if await etcd.get(key) is not None:
                break
            await asyncio.sleep(0.05)
        assert await etcd.get(key) is not None
    assert await etcd.get(key) is None


async def test_without_etcd_the_cluster_view_is_a_503_and_jobs_are_still_served(
    database_url: str, redis_url: str, stack: object
) -> None:
    nowhere = "127.0.0.1:1"  # nothing listens on port 1
    app = create_app(settings_for(database_url, redis_url, nowhere))
    register_replica(app)  # keeps retrying in the background; must not hold anything up
    async for client in serve(app):
        view = await client.get("/v1/admin/cluster", headers=bearer(admin=True))
        assert view.status_code == 503
        assert "etcd" in view.json()["detail"]
        job = await client.post(
            "/v1/jobs",
            headers={"Authorization": f"Bearer {tenant_token(database_url, 'ops', secret=SECRET, pools=['p'])}"},
            json={"name": "x", "type": "DELAYED", "delaySeconds": 60, "target": {"pool": "p", "handler": "h"}},
        )
        assert job.status_code == 201, job.text
