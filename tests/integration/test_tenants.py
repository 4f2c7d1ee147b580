"""The tenant registry over HTTP: registration gates tokens, suspension stops writes, quotas answer as users
expect (nothing written), the default cron jitter, and jobs found by their labels."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import pytest
from sundial_api.app import create_app
from sundial_api.settings import ApiSettings
from sundial_common.commands.migrate import main as migrate_main
from sundial_common.domain.ids import new_id
from sundial_common.security.auth import issue_token

from tests.support.pools import admit
from tests.support.tenants import tenant_token

SECRET = "tenants-test-secret-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {issue_token(SECRET, 'ops', admin=True)}"}


def job(name: str = "j", **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": "DELAYED", "delaySeconds": 600, "target": {"pool": "p", "handler": "h"}, **extra}


@pytest.fixture
async def client(database_url: str, redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(ApiSettings(database_url=database_url, redis_url=redis_url, jwt_secret=SECRET, shards=2))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api.test") as http,
    ):
        yield http


def bearer(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {issue_token(SECRET, tenant)}"}


async def jobs_of(database_url: str, tenant: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM jobs WHERE tenant_id = $1", tenant))
    finally:
        await conn.close()


async def test_only_registered_active_tenants_are_served(client: httpx.AsyncClient, database_url: str) -> None:
    unknown = await client.post("/v1/jobs", json=job(), headers=bearer("acme"))
    assert unknown.status_code == 401 and "not registered" in unknown.json()["detail"]

    created = await client.post(
        "/v1/admin/tenants", json={"id": "acme", "displayName": "Acme", "weight": 3}, headers=ADMIN
    )
    assert created.status_code == 201, created.text
    assert created.json()["weight"] == 3 and created.json()["quotas"]["maxActiveJobs"] is None
    again = await client.post("/v1/admin/tenants", json={"id": "acme"}, headers=ADMIN)
    assert again.status_code == 409 and again.json()["errors"][0]["field"] == "id"
    admit(database_url, "p", "acme")  # work goes only into a pool the tenant may use
    assert (await client.post("/v1/admin/tenants", json={"id": "x"}, headers=bearer("acme"))).status_code == 403

    accepted = await client.post("/v1/jobs", json=job(), headers=bearer("acme"))
    assert accepted.status_code == 201, accepted.text

    suspended = await client.post("/v1/admin/tenants/acme/suspend", headers=ADMIN)
    assert suspended.json()["state"] == "SUSPENDED"
    refused = await client.post("/v1/jobs", json=job(), headers=bearer("acme"))
    assert refused.status_code == 403 and refused.json()["type"].endswith(":tenant-suspended")
    assert (await client.get(f"/v1/jobs/{accepted.json()['jobId']}", headers=bearer("acme"))).status_code == 200

    assert (await client.post("/v1/admin/tenants/acme/resume", headers=ADMIN)).json()["state"] == "ACTIVE"
    assert (await client.post("/v1/jobs", json=job(), headers=bearer("acme"))).status_code == 201
    assert await jobs_of(database_url, "acme") == 2

    listed = await client.get("/v1/admin/tenants", headers=ADMIN)
    assert [t["id"] for t in listed.json()["items"]] == ["acme"]
    patched = await client.patch(
        "/v1/admin/tenants/acme", json={"quotas": {"maxActiveJobs": 5}, "defaultJitterSec": 30}, headers=ADMIN
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["quotas"]["maxActiveJobs"] == 5 and patched.json()["weight"] == 3
    bad = await client.patch("/v1/admin/tenants/acme", json={"weight": 0}, headers=ADMIN)
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "weight"
    assert (await client.get("/v1/admin/tenants/nobody", headers=ADMIN)).status_code == 404


async def test_max_active_jobs_is_a_403_naming_the_quota_and_count_and_writes_nothing(
    client: httpx.AsyncClient, database_url: str
) -> None:
    tenant_token(database_url, "capped", secret=SECRET, pools=["p"], max_active_jobs=3)
    for i in range(3):
        assert (await client.post("/v1/jobs", json=job(f"j{i}"), headers=bearer("capped"))).status_code == 201
    over = await client.post("/v1/jobs", json=job("over"), headers=bearer("capped"))
    assert over.status_code == 403, over.text
    problem = over.json()
    assert problem["type"].endswith(":quota-exceeded")
    assert "maxActiveJobs" in problem["detail"] and "has 3" in problem["detail"]
    assert problem["errors"][0]["field"] == "quotas.maxActiveJobs"
    assert await jobs_of(database_url, "capped") == 3

    # A cancelled job frees its slot; a batch is answered per item.
    first = (await client.get("/v1/jobs", headers=bearer("capped"))).json()["items"][0]["jobId"]
    assert (await client.delete(f"/v1/jobs/{first}", headers=bearer("capped"))).status_code == 200
    batch = await client.post("/v1/jobs:batch", json={"jobs": [job("b1"), job("b2")]}, headers=bearer("capped"))
    assert [r["status"] for r in batch.json()["results"]] == [201, 403]
    assert batch.json()["results"][1]["problem"]["type"].endswith(":quota-exceeded")
    assert await jobs_of(database_url, "capped") == 4  # 3 active + 1 cancelled


async def test_create_rate_over_quota_is_a_429_with_retry_after_and_writes_nothing(
    client: httpx.AsyncClient, database_url: str
) -> None:
    tenant_token(database_url, "slow", secret=SECRET, pools=["p"], max_creates_per_sec=2)
    answers = [(await client.post("/v1/jobs", json=job(), headers=bearer("slow"))) for _ in range(4)]
    statuses = [a.status_code for a in answers]
    # A burst of one second's worth passes, the rest is refused (a slow machine may refill one token).
    assert statuses[:2] == [201, 201] and 429 in statuses[2:], statuses
    limited = next(a for a in answers if a.status_code == 429)
    assert int(limited.headers["Retry-After"]) >= 1
    assert limited.json()["errors"][0]["field"] == "quotas.maxCreatesPerSec"
    assert await jobs_of(database_url, "slow") == statuses.count(201)


async def test_the_default_cron_jitter_applies_unless_a_job_opts_out(
    client: httpx.AsyncClient, database_url: str
) -> None:
    tenant_token(database_url, "nightly", secret=SECRET, pools=["p"], default_jitter_sec=900)
    cron = {"name": "c", "type": "CRON", "schedule": "0 0 * * *", "target": {"pool": "p", "handler": "h"}}
    defaulted = await client.post("/v1/jobs", json=cron, headers=bearer("nightly"))
    opted_out = await client.post("/v1/jobs", json={**cron, "jitterSec": 0}, headers=bearer("nightly"))
    one_off = await client.post("/v1/jobs", json=job(), headers=bearer("nightly"))
    assert defaulted.json()["jitterSec"] == 900
    assert opted_out.json()["jitterSec"] == 0
    assert one_off.json()["jitterSec"] == 0


async def test_jobs_are_found_by_labels_name_and_ranges(client: httpx.AsyncClient, database_url: str) -> None:
    auth = {"Authorization": f"Bearer {tenant_token(database_url, 'finder', secret=SECRET, pools=['p'])}"}
    growth = await client.post("/v1/jobs", json=job("mail-a", labels={"team": "growth"}), headers=auth)
    await client.post("/v1/jobs", json=job("mail-b", labels={"team": "core"}), headers=auth)
    await client.post("/v1/jobs", json=job("report", labels={"team": "growth", "tier": "1"}), headers=auth)
    assert growth.json()["labels"] == {"team": "growth"}

    async def names(**params: Any) -> list[str]:
        page = await client.get("/v1/jobs", params=params, headers=auth)
        assert page.status_code == 200, page.text
        return sorted(j["name"] for j in page.json()["items"])

    assert await names(label="team:growth") == ["mail-a", "report"]
    assert await names(label=["team:growth", "tier:1"]) == ["report"]
    assert await names(namePrefix="mail", label="team:core") == ["mail-b"]
    assert await names(createdFrom="2000-01-01T00:00:00Z", createdTo="2001-01-01T00:00:00Z") == []
    bad = await client.get("/v1/jobs", params={"label": "nocolon"}, headers=auth)
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "label"
    too_many = await client.post("/v1/jobs", json=job(labels={f"k{i}": "v" for i in range(33)}), headers=auth)
    assert too_many.status_code == 422 and too_many.json()["errors"][0]["field"] == "labels"

    patched = await client.patch(f"/v1/jobs/{growth.json()['jobId']}", json={"labels": {"team": "core"}}, headers=auth)
    assert patched.status_code == 200, patched.text
    assert await names(label="team:core") == ["mail-a", "mail-b"]


async def test_migrate_registers_the_dev_tenant_once(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    # `make up` and docker compose run `sundial migrate --tenant demo` before the API starts.
    for _ in range(2):
        assert await asyncio.to_thread(migrate_main, ["--database-url", database_url, "--tenant", "demo"]) == 0
    out = capsys.readouterr().out
    assert "tenants registered: demo" in out and "tenants registered: none new" in out
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval("SELECT state FROM tenants WHERE id = 'demo'") == "ACTIVE"
    finally:
        await conn.close()


async def test_executions_are_listed_without_a_state_and_filtered_by_job_pool_handler_and_time(
    client: httpx.AsyncClient, database_url: str
) -> None:
    auth = {"Authorization": f"Bearer {tenant_token(database_url, 'lister', secret=SECRET, pools=['p', 'q'])}"}
    a = (await client.post("/v1/jobs", json=job("a"), headers=auth)).json()["jobId"]
    b = (await client.post("/v1/jobs", json=job("b", target={"pool": "q", "handler": "other"}), headers=auth)).json()[
        "jobId"
    ]
    conn = await asyncpg.connect(database_url)
    ids = iter(sorted(new_id() for _ in range(3)))  # creation order: two UUIDv7 of one millisecond compare either way
    try:  # executions as the dispatcher writes them: a's in two states, b's one
        for job_id, pool, handler, state, minute in (
            (a, "p", "h", "SUCCEEDED", 1),
            (a, "p", "h", "DEAD", 2),
            (b, "q", "other", "PENDING", 3),
        ):
            await conn.execute(
                "INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler,"
                " state, timeout_sec) VALUES ($1, 'lister', $2, $3, 0, 1, $4, $5, $6, 30)",
                next(ids),
                uuid.UUID(job_id),
                datetime(2026, 1, 1, 0, minute, tzinfo=UTC),
                pool,
                handler,
                state,
            )
    finally:
        await conn.close()

    async def listed(**params: Any) -> list[tuple[str, str]]:
        page = await client.get("/v1/executions", params=params, headers=auth)
        assert page.status_code == 200, page.text
        return [(e["jobId"], e["state"]) for e in page.json()["items"]]

    assert await listed() == [(b, "PENDING"), (a, "DEAD"), (a, "SUCCEEDED")]  # newest first, every state
    assert await listed(jobId=a) == [(a, "DEAD"), (a, "SUCCEEDED")]
    assert await listed(pool="q") == [(b, "PENDING")]
    assert await listed(handler="h", state=["DEAD", "PENDING"]) == [(a, "DEAD")]
    assert await listed(scheduledFrom="2026-01-01T00:02:00Z", scheduledTo="2026-01-01T00:03:00Z") == [(a, "DEAD")]
    first = await client.get("/v1/executions", params={"limit": 2}, headers=auth)
    rest = await client.get("/v1/executions", params={"cursor": first.json()["nextCursor"]}, headers=auth)
    assert len(first.json()["items"]) == 2 and [e["state"] for e in rest.json()["items"]] == ["SUCCEEDED"]
    bad = await client.get("/v1/executions", params={"jobId": "nope"}, headers=auth)
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "jobId"
