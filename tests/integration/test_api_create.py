"""``POST /v1/jobs`` under concurrency: group commit (:mod:`sundial_api.group_commit`) and the registry caches.

Concurrent single creates are written together, one statement per group; what a client sees must not
change: each request its own job, answer, audit row and hot-window member; a job Postgres refuses fails alone;
an Idempotency-Key is honoured beside grouped creates. In-process API on real Postgres and Redis (the
``api`` fixture of ``test_api``).
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from sundial_api.state import ApiState
from sundial_api.tenant_cache import TenantCache
from sundial_common.stores import Stores
from sundial_common.stores.pool_cache import PoolCache
from sundial_common.stores.pools import Pool
from sundial_common.stores.tenants import Tenant

from tests.support.api import NOW, TENANT, Api, api, delayed, ms
from tests.support.tenants import tenant_token

__all__ = ["api"]  # the fixture


def state(api: Api) -> ApiState:
    current: ApiState = api.app.state.api
    return current


@pytest.mark.parametrize("api", [{"create_group_writers": 1}], indirect=True)
async def test_concurrent_creates_are_written_together_and_each_gets_its_own_job(api: Api) -> None:
    # Two tenants, near-due and far jobs, each request with a payload of its own.
    bodies = [
        (tenant, delayed(name=f"c-{tenant}-{i}", delaySeconds=60 + i if i % 2 else 86400 * 2, payload={"i": i}))
        for i in range(20)
        for tenant in (TENANT, "other")
    ]
    responses = await asyncio.gather(*(api.create(body, tenant=tenant) for tenant, body in bodies))

    groups = state(api).create_groups
    assert groups.grouped_jobs == len(bodies) and groups.groups < len(bodies)  # written together
    ids = set()
    for (tenant, body), response in zip(bodies, responses, strict=True):
        assert response.status_code == 201, response.text
        job = response.json()
        assert (job["name"], job["payload"]) == (body["name"], body["payload"])  # its own answer
        assert response.headers["location"] == f"/v1/jobs/{job['jobId']}"
        ids.add(job["jobId"])
        row = await api.db.fetchrow("SELECT * FROM jobs WHERE id = $1", uuid.UUID(job["jobId"]))
        assert (row["tenant_id"], row["name"]) == (tenant, body["name"])
        actor = await api.db.fetchval(
            "SELECT actor FROM audit_log WHERE entity_id = $1 AND action = 'create'", row["id"]
        )
        assert actor == f"{tenant}-service"
        fire = NOW + timedelta(seconds=body["delaySeconds"])
        expected = ms(fire) if body["delaySeconds"] < api.settings.hot_window_sec else None
        assert await api.score(row["shard"], job["jobId"]) == expected  # near-due: in the hot window at once
        # The answer is the stored job: reading it gives the same view (the create's warnings aside: no worker
        # reads these pools).
        read = await api.client.get(f"/v1/jobs/{job['jobId']}", headers=api.auth(tenant))
        job.pop("warnings")
        assert {k: read.json()[k] for k in job} == job
    assert len(ids) == len(bodies)
    assert await api.db.fetchval("SELECT count(*) FROM jobs") == len(bodies)


@pytest.mark.parametrize("api", [{"create_group_writers": 1}], indirect=True)
async def test_a_job_postgres_refuses_fails_alone_and_the_rest_of_its_group_is_written(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    # A job that passes the API's validation but that Postgres refuses (here: a constraint of the test's own).
    await api.db.execute("ALTER TABLE jobs ADD CONSTRAINT no_poison CHECK (name <> 'poison')")
    names = [f"fine-{i}" for i in range(10)]
    names.insert(5, "poison")
    answers = await asyncio.gather(*(api.create(delayed(name=n)) for n in names), return_exceptions=True)

    for name, answer in zip(names, answers, strict=True):
        if name == "poison":  # the in-process transport re-raises what the API answered 500 for
            assert isinstance(answer, asyncpg.CheckViolationError), answer
        else:
            assert not isinstance(answer, BaseException) and answer.status_code == 201, answer
    written = {r["name"] for r in await api.db.fetch("SELECT name FROM jobs")}
    assert written == set(names) - {"poison"}
    assert await api.db.fetchval("SELECT count(*) FROM audit_log WHERE action = 'create'") == len(written)
    assert "writing them one by one" in caplog.text  # the poison was refused within a group, not alone


async def test_an_idempotency_key_is_honoured_beside_grouped_creates(api: Api) -> None:
    keyed = delayed(name="keyed")
    headers = {**api.auth(), "Idempotency-Key": "gc-1"}

    async def keyed_create() -> Any:
        return await api.client.post("/v1/jobs", json=keyed, headers=headers)

    first, *_ = await asyncio.gather(keyed_create(), *(api.create(delayed(name=f"plain-{i}")) for i in range(10)))
    assert first.status_code == 201, first.text
    again, *others = await asyncio.gather(keyed_create(), *(api.create(delayed(name=f"more-{i}")) for i in range(10)))
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    assert all(r.status_code == 201 for r in others)
    assert await api.db.fetchval("SELECT count(*) FROM jobs WHERE name = 'keyed'") == 1
    assert await api.db.fetchval("SELECT count(*) FROM jobs") == 21


async def test_an_expired_registry_entry_is_read_once_by_concurrent_requests(database_url: str) -> None:
    tenant_token(database_url, TENANT, pools=["demo"])
    stores = await Stores.connect(database_url, min_size=1, max_size=4)
    try:
        reads: list[str] = []

        class CountingTenants:
            async def get_tenant(self, tenant_id: str) -> Tenant | None:
                reads.append(tenant_id)
                return await stores.tenants.get_tenant(tenant_id)

        class CountingPools:
            async def get_pool(self, name: str) -> Pool | None:
                reads.append(name)
                return await stores.pools.get_pool(name)

        # A TTL of 0: every call finds its entry expired.
        tenants = TenantCache(CountingTenants(), 0)  # type: ignore[arg-type]
        pools = PoolCache(CountingPools(), 0)  # type: ignore[arg-type]
        answers = await asyncio.gather(
            *(tenants.get(TENANT) for _ in range(20)), *(pools.get("demo") for _ in range(20))
        )
        assert reads == [TENANT, "demo"]  # one read each, shared by the 20 callers
        assert {a.id for a in answers[:20] if isinstance(a, Tenant)} == {TENANT}
        assert {a.name for a in answers[20:] if isinstance(a, Pool)} == {"demo"}
        # Later calls read again (the entry is still expired), and a recheck never reuses an earlier read.
        assert (await tenants.get(TENANT)) is not None and (await pools.recheck("demo")) is not None
        assert len(reads) == 4
    finally:
        await stores.close()
