"""Workers are visible: each announces its pool, handlers and free slots, and Sundial says when nothing will run a
pool's work — in a pool's view, a PENDING execution's ``waitingFor``, a job's create and PATCH warnings, and the one
definition of "a pool has work and no live worker" the sweeper's gauge and alert use."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import pytest
from redis.asyncio import Redis
from sundial_api.app import create_app
from sundial_api.settings import ApiSettings
from sundial_common.coordination.pool_service import pools_service
from sundial_common.hotwindow.worker_announcements import WorkerAnnouncement, WorkerAnnouncements
from sundial_common.observability.metrics import REGISTRY
from sundial_common.stores import Stores
from sundial_sweeper.pool_gauges import PoolGauges
from sundial_worker.settings import WorkerSettings

from tests.support.pools import admit
from tests.support.tenants import tenant_token
from tests.support.worker import TENANT, demo_worker, dispatch, serving

SECRET = "announcements-test-secret-0123456789"


def announcement(pool: str, worker_id: str, *handlers: str, free: int = 4) -> WorkerAnnouncement:
    return WorkerAnnouncement(
        worker_id=worker_id,
        pool=pool,
        handlers=handlers,
        concurrency=4,
        free_slots=free,
        version="test",
        host="h",
        pid=1,
        started_at=datetime.now(UTC),
    )


@pytest.fixture
async def announcements(redis_url: str) -> AsyncIterator[WorkerAnnouncements]:
    redis = Redis.from_url(redis_url)
    yield WorkerAnnouncements(redis)
    await redis.aclose()


async def test_announcements_are_live_until_they_lapse_or_are_withdrawn(announcements: WorkerAnnouncements) -> None:
    await announcements.announce(announcement("p", "w1", "a", "b"), ttl_sec=30)
    await announcements.announce(announcement("p", "w2", "a", free=0), ttl_sec=0.5)
    await announcements.announce(announcement("q", "w3", "c"), ttl_sec=30)
    [first, second] = await announcements.live("p")
    assert (first.worker_id, first.handlers, first.free_slots) == ("w1", ("a", "b"), 4)
    assert (second.worker_id, second.free_slots) == ("w2", 0)
    assert first.expires_at is not None and first.expires_at > datetime.now(UTC)
    assert {pool: [w.worker_id for w in ws] for pool, ws in (await announcements.live_pools()).items()} == {
        "p": ["w1", "w2"],
        "q": ["w3"],
    }
    deadline = asyncio.get_running_loop().time() + 10
    while [w.worker_id for w in await announcements.live("p")] != ["w1"]:  # w2 stopped renewing: it lapses
        assert asyncio.get_running_loop().time() < deadline, "an announcement outlived its TTL"
        await asyncio.sleep(0.1)
    await announcements.withdraw("p", "w1")
    assert await announcements.live("p") == []
    assert list(await announcements.live_pools()) == ["q"]


async def test_a_running_worker_announces_its_handlers_and_free_slots_then_withdraws(
    announcements: WorkerAnnouncements, settings: WorkerSettings, database_url: str
) -> None:
    pool = admit(database_url, f"w-{uuid.uuid4().hex[:10]}", TENANT)
    async with serving(demo_worker(pool), settings) as runtime:
        [me] = await announcements.live(pool)
        assert me.worker_id == runtime.worker_id
        assert me.handlers == ("echo", "fail", "sleep")
        assert me.concurrency == runtime.config.concurrency == me.free_slots
    assert await announcements.live(pool) == []  # a graceful stop withdraws at once


@pytest.fixture
def settings(database_url: str, redis_url: str, kafka_bootstrap: str) -> WorkerSettings:
    return WorkerSettings(database_url=database_url, redis_url=redis_url, kafka_bootstrap=kafka_bootstrap)


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


def _job(pool: str, handler: str) -> dict[str, object]:
    return {"name": "j", "type": "DELAYED", "delaySeconds": 600, "target": {"pool": pool, "handler": handler}}


async def test_the_api_says_when_no_live_worker_will_run_the_work(
    client: httpx.AsyncClient, announcements: WorkerAnnouncements, stores: Stores, database_url: str
) -> None:
    unread, other, served = (admit(database_url, f"{n}-{uuid.uuid4().hex[:8]}", TENANT) for n in "uos")
    elsewhere = admit(database_url, f"x-{uuid.uuid4().hex[:8]}", "someone-else")
    headers = {"Authorization": f"Bearer {tenant_token(database_url, TENANT, secret=SECRET)}"}
    await announcements.announce(announcement(other, "w-other", "resize"), ttl_sec=60)
    await announcements.announce(announcement(served, "w-served", "h", "resize", free=3), ttl_sec=60)

    # A create naming a handler nothing would run is accepted, with a warning saying why (before anyone waits).
    created = await client.post("/v1/jobs", json=_job(unread, "h"), headers=headers)
    assert created.status_code == 201, created.text
    created_first = created.json()["jobId"]
    [warning] = created.json()["warnings"]
    assert warning["field"] == "target.handler" and f"no live worker reads pool `{unread}`" in warning["message"]
    created = await client.post("/v1/jobs", json=_job(other, "h"), headers=headers)
    [warning] = created.json()["warnings"]
    assert f"no live worker of pool `{other}` serves handler `h` (they serve: resize)" in warning["message"]
    fine = await client.post("/v1/jobs", json=_job(served, "h"), headers=headers)
    assert fine.status_code == 201 and "warnings" not in fine.json()
    # A batch's items carry the same warnings as a single create.
    batch = await client.post(
        "/v1/jobs:batch", json={"jobs": [_job(unread, "h"), _job(served, "h"), _job(other, "h")]}, headers=headers
    )
    assert batch.status_code == 200, batch.text
    jobs = [result["job"] for result in batch.json()["results"]]
    assert f"no live worker reads pool `{unread}`" in jobs[0]["warnings"][0]["message"]
    assert "warnings" not in jobs[1]
    assert jobs[2]["warnings"] == [warning]
    # A PATCH that moves the job where nothing serves it says so too.
    patched = await client.patch(
        f"/v1/jobs/{fine.json()['jobId']}", json={"target": {"pool": other, "handler": "h"}}, headers=headers
    )
    assert patched.status_code == 200, patched.text
    assert "serves handler `h`" in patched.json()["warnings"][0]["message"]

    # Work waiting in a pool nobody reads: the execution and the pool say so.
    [message] = await dispatch(stores, unread, "h", [{"n": 1}])
    execution = (await client.get(f"/v1/executions/{message.execution_id}", headers=headers)).json()
    assert execution["state"] == "PENDING" and execution["waitingFor"] == f"no live worker in pool {unread}"
    view = (await client.get(f"/v1/pools/{unread}", headers=headers)).json()
    assert view["workers"] == {"live": 0, "freeSlots": 0, "handlers": [], "items": []}
    assert view["backlog"]["pending"] == 1 and view["backlog"]["oldestPendingAt"]
    assert view["warnings"] == [f"no live worker in pool {unread}: 1 of your executions wait for one"]
    # Where a job's state shows, its latest execution's shows beside it: a fired one-shot is not "done".
    listed = (await client.get("/v1/jobs", params={"pool": unread}, headers=headers)).json()["items"]
    states = {item["jobId"]: (item["state"], item["latestExecutionState"]) for item in listed}
    assert states[message.job_id] == ("COMPLETED", "PENDING") and states[created_first] == ("ACTIVE", None)
    job = (await client.get(f"/v1/jobs/{message.job_id}", headers=headers)).json()
    assert (job["state"], job["latestExecutionState"]) == ("COMPLETED", "PENDING")
    [message] = await dispatch(stores, served, "h", [{"n": 2}])
    execution = (await client.get(f"/v1/executions/{message.execution_id}", headers=headers)).json()
    assert execution["waitingFor"] is None

    view = (await client.get(f"/v1/pools/{served}", headers=headers)).json()
    assert (view["workers"]["live"], view["workers"]["freeSlots"], view["workers"]["handlers"]) == (
        1,
        3,
        ["h", "resize"],
    )
    assert view["workers"]["items"][0]["workerId"] == "w-served" and view["warnings"] == []
    # Another tenant's pool, or one nobody registered, is simply not found.
    for name in (elsewhere, "never-registered"):
        assert (await client.get(f"/v1/pools/{name}", headers=headers)).status_code == 404

    # The one definition the sweeper's gauge (and its alert) uses: work waits and nobody reads the pool.
    pools = await pools_service(announcements, stores.executions, [other])
    assert pools[unread].unserved and not pools[served].unserved and not pools[other].unserved


async def test_the_sweeper_samples_each_pools_workers_and_whether_its_work_is_unserved(
    announcements: WorkerAnnouncements, stores: Stores, database_url: str
) -> None:
    unread, served = (admit(database_url, f"{n}-{uuid.uuid4().hex[:8]}", TENANT) for n in "us")
    await dispatch(stores, unread, "h", [{"n": 1}, {"n": 2}])
    await announcements.announce(announcement(served, "w", "h"), ttl_sec=60)
    gauges = PoolGauges(announcements.redis, stores.executions)
    await gauges.sample()

    def value(name: str, pool: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"pool": pool})

    assert (value("sundial_pool_live_workers", unread), value("sundial_pool_pending_executions", unread)) == (0, 2)
    assert (value("sundial_pool_unserved", unread), value("sundial_pool_unserved", served)) == (1, 0)
    assert value("sundial_pool_live_workers", served) == 1
    gauges.forget()  # a sweeper that stops leading reports nothing
    assert value("sundial_pool_unserved", unread) is None
