"""The HTTP API on real Postgres and Redis, driven in-process through its ASGI interface.

Each test gets a fresh migrated database and a flushed Redis (``database_url`` / ``redis_url``), runs the
app inside its lifespan, and checks what a client sees *and* what was written: the job row, the audit row,
the hot-window member and its score. Every rejected request is checked to have written nothing.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from typing import Any

import asyncpg
import httpx
import jwt
import orjson
import pytest
from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from redis.asyncio import Redis
from sundial_api import ApiSettings, create_app
from sundial_api.models.common import Problem
from sundial_api.models.executions import ExecutionDetail, ExecutionPage
from sundial_api.models.jobs import JobDetail
from sundial_common.domain.ids import new_id
from sundial_common.hotwindow.window import member
from sundial_common.testing import FakeClock
from sundial_infra.stack import LocalStack

from tests.support.tenants import tenant_token

SECRET = "test-signing-key-for-the-api-suite"
TENANT = "acme"
#: The pools the API tests send work into (registered for TENANT by the `api` fixture).
POOLS = ("demo", "email-sender", "reports")
# A fixed "now" (millisecond-aligned) makes fire times exact; it is near the real time because the
# dispatcher-facing code compares against Redis scores, and readers of these rows expect sane dates.
NOW = datetime.now(UTC).replace(microsecond=123000) + timedelta(days=1)


def rfc3339(instant: datetime) -> str:
    return instant.isoformat().replace("+00:00", "Z")


def ms(instant: datetime) -> int:
    return int(instant.timestamp() * 1000)


@dataclass
class Api:
    client: httpx.AsyncClient
    db: asyncpg.Connection
    redis: Redis
    settings: ApiSettings
    clock: FakeClock
    app: FastAPI

    def auth(self, tenant: str = TENANT) -> dict[str, str]:
        token = tenant_token(self.settings.database_url, tenant, secret=SECRET, pools=POOLS)
        return {"Authorization": f"Bearer {token}"}

    async def create(self, body: dict[str, Any], tenant: str = TENANT, **kwargs: Any) -> httpx.Response:
        return await self.client.post("/v1/jobs", json=body, headers=self.auth(tenant), **kwargs)

    async def counts(self) -> dict[str, int]:
        return {
            table: await self.db.fetchval(f"SELECT count(*) FROM {table}")
            for table in ("jobs", "audit_log", "executions")
        }

    async def score(self, shard: int, job_id: str) -> float | None:
        return await self.redis.zscore(f"sundial:{{{shard}}}:hot", member(uuid.UUID(job_id)))


@pytest.fixture
async def api(request: pytest.FixtureRequest, database_url: str, redis_url: str) -> AsyncIterator[Api]:
    overrides: dict[str, Any] = getattr(request, "param", {})  # settings of a test's own (indirect parametrize)
    settings = ApiSettings(database_url=database_url, redis_url=redis_url, jwt_secret=SECRET, shards=4, **overrides)
    clock = FakeClock(NOW)
    app = create_app(settings, clock=clock)
    # Registered (with the pools the tests send work into) before any test can stop Postgres, and every tenant
    # of a pool before the API first reads it (its registry cache would answer 403 to one admitted later).
    for tenant in (TENANT, "other", "globex"):
        tenant_token(database_url, tenant, secret=SECRET, pools=POOLS)
    db = await asyncpg.connect(database_url)
    redis = Redis.from_url(redis_url)
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api.test") as client,
        ):
            yield Api(client, db, redis, settings, clock, app)
    finally:
        await redis.aclose()
        await db.close()


def one_shot(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "welcome-email",
        "type": "ONE_SHOT",
        "runAt": rfc3339(NOW + timedelta(minutes=5)),
        "target": {"pool": "email-sender", "handler": "send_welcome"},
        "payload": {"userId": 42},
    }
    body.update(overrides)
    return body


def delayed(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "reminder",
        "type": "DELAYED",
        "delaySeconds": 90,
        "target": {"pool": "demo", "handler": "echo"},
    }
    body.update(overrides)
    return body


def error_fields(response: httpx.Response) -> list[str]:
    assert response.headers["content-type"] == "application/problem+json", response.text
    problem = response.json()
    Problem.model_validate(problem)
    assert problem["status"] == response.status_code
    return [e["field"] for e in problem["errors"]]


async def insert_execution(api: Api, job_id: str, scheduled_for: datetime, **columns: Any) -> uuid.UUID:
    values: dict[str, Any] = {
        "id": new_id(),
        "tenant_id": TENANT,
        "job_id": uuid.UUID(job_id),
        "scheduled_for": scheduled_for,
        "shard": 0,
        "fence_token": 7,
        "pool": "demo",
        "handler": "echo",
        "state": "PENDING",
        "timeout_sec": 600,
    }
    values.update(columns)
    names = ", ".join(values)
    params = ", ".join(f"${i}" for i in range(1, len(values) + 1))
    await api.db.execute(f"INSERT INTO executions ({names}) VALUES ({params})", *values.values())
    return values["id"]  # type: ignore[no-any-return]


# --- create ---------------------------------------------------------------------------------------


async def test_create_one_shot_stores_the_job_and_puts_it_in_the_hot_window(api: Api) -> None:
    run_at = NOW + timedelta(minutes=5, microseconds=456789)  # sub-millisecond digits are dropped
    response = await api.create(one_shot(runAt=rfc3339(run_at)))

    assert response.status_code == 201, response.text
    job = response.json()
    assert response.headers["location"] == f"/v1/jobs/{job['jobId']}"
    expected_fire = run_at.replace(microsecond=run_at.microsecond // 1000 * 1000)
    assert job["nextFireAt"] == job["runAt"] == rfc3339(expected_fire)
    assert job["state"] == "ACTIVE" and job["type"] == "ONE_SHOT" and job["timezone"] == "UTC"
    assert job["target"] == {"pool": "email-sender", "handler": "send_welcome"}
    assert job["payload"] == {"userId": 42}
    assert job["retryPolicy"] == {
        "maxAttempts": 3,
        "backoff": "EXPONENTIAL",
        "initialDelayMs": 30000,
        "maxDelayMs": 3600000,
        "jitter": True,
    }
    assert (job["timeoutSec"], job["priority"], job["fireCount"], job["version"]) == (600, "NORMAL", 0, 1)
    assert job["createdAt"].endswith("Z")

    row = await api.db.fetchrow("SELECT * FROM jobs WHERE id = $1", uuid.UUID(job["jobId"]))
    assert row["tenant_id"] == TENANT and row["next_fire_at"] == expected_fire
    assert row["shard"] in range(api.settings.shards)
    assert await api.db.fetchval("SELECT actor FROM audit_log WHERE entity_id = $1", row["id"]) == "acme-service"
    assert await api.score(row["shard"], job["jobId"]) == ms(expected_fire)


async def test_create_delayed_fires_delay_seconds_after_now(api: Api) -> None:
    response = await api.create(delayed(delaySeconds=90, priority="HIGH", timeoutSec=30))

    assert response.status_code == 201, response.text
    job = response.json()
    fire = NOW + timedelta(seconds=90)
    assert job["nextFireAt"] == rfc3339(fire)
    assert job["runAt"] is None and job["delaySeconds"] == 90
    assert (job["priority"], job["timeoutSec"]) == ("HIGH", 30)
    shard = await api.db.fetchval("SELECT shard FROM jobs WHERE id = $1", uuid.UUID(job["jobId"]))
    assert await api.score(shard, job["jobId"]) == ms(fire)


async def test_a_job_due_beyond_the_hot_window_is_left_to_the_hydrator(api: Api) -> None:
    response = await api.create(delayed(delaySeconds=api.settings.hot_window_sec + 3600))

    assert response.status_code == 201
    assert await api.db.fetchval("SELECT count(*) FROM jobs") == 1
    assert sum([await api.redis.zcard(f"sundial:{{{s}}}:hot") for s in range(api.settings.shards)]) == 0


async def test_a_naive_run_at_is_wall_clock_time_in_the_jobs_timezone(api: Api) -> None:
    local = (NOW + timedelta(days=2)).replace(tzinfo=None, hour=9, minute=30, second=0, microsecond=0)
    response = await api.create(one_shot(runAt=local.isoformat(), timezone="Asia/Kolkata"))  # UTC+05:30, no DST

    assert response.status_code == 201, response.text
    assert response.json()["nextFireAt"] == rfc3339((local - timedelta(hours=5, minutes=30)).replace(tzinfo=UTC))


async def test_a_run_at_within_the_grace_period_fires_at_once(api: Api) -> None:
    run_at = NOW - timedelta(seconds=api.settings.run_at_grace_sec - 1)
    response = await api.create(one_shot(runAt=rfc3339(run_at)))

    assert response.status_code == 201, response.text
    job = response.json()
    shard = await api.db.fetchval("SELECT shard FROM jobs WHERE id = $1", uuid.UUID(job["jobId"]))
    # Already due: the dispatcher's next claim (score <= now) takes it.
    assert await api.score(shard, job["jobId"]) == ms(run_at) <= ms(NOW)


async def test_a_job_is_accepted_when_redis_is_down(database_url: str) -> None:
    # Postgres is the truth (DESIGN invariant 1): the hydrator's overdue scan adds the member later.
    settings = ApiSettings(
        database_url=database_url, redis_url="redis://127.0.0.1:9/0", jwt_secret=SECRET, redis_timeout_sec=0.2
    )
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api.test") as client,
    ):
        headers = {"Authorization": f"Bearer {tenant_token(database_url, TENANT, secret=SECRET, pools=POOLS)}"}
        body = one_shot(runAt=rfc3339(datetime.now(UTC) + timedelta(minutes=1)))
        created = await client.post("/v1/jobs", json=body, headers=headers)
        cancelled = await client.delete(f"/v1/jobs/{created.json()['jobId']}", headers=headers)
        ready = await client.get("/readyz")

    assert created.status_code == 201, created.text
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "CANCELLED"
    assert ready.status_code == 503
    assert ready.json()["checks"]["postgres"] == "ok" and ready.json()["checks"]["redis"] != "ok"


async def test_requests_get_503_while_postgres_is_down(api: Api, stack: LocalStack) -> None:
    stack.postgres.stop()
    try:
        created = await api.create(one_shot())
        read = await api.client.get(f"/v1/jobs/{uuid.uuid4()}", headers=api.auth())
        ready = await api.client.get("/readyz")
    finally:
        stack.postgres.start()

    for response in (created, read, ready):
        assert response.status_code == 503, response.text
        error_fields(response)
    assert created.headers["retry-after"] == "1"
    assert ready.json()["checks"]["postgres"] != "ok" and ready.json()["checks"]["redis"] == "ok"
    # The pool reconnects on its own once Postgres is back.
    assert (await api.create(one_shot())).status_code == 201


# --- bad input: the right status, the field named, nothing written ---------------------------------

BAD_BODIES: list[tuple[str, dict[str, Any], int, str]] = [
    ("unknown field", one_shot(colour="blue"), 422, "colour"),
    ("snake_case field", {**delayed(), "delaySeconds": None, "delay_seconds": 5}, 422, "delay_seconds"),
    (
        "unknown nested field",
        one_shot(target={"pool": "demo", "handler": "echo", "region": "eu"}),
        422,
        "target.region",
    ),
    ("pool syntax", one_shot(target={"pool": "Email Sender", "handler": "echo"}), 422, "target.pool"),
    ("pool too long", one_shot(target={"pool": "p" * 64, "handler": "echo"}), 422, "target.pool"),
    ("handler syntax", one_shot(target={"pool": "demo", "handler": "9lives"}), 422, "target.handler"),
    ("handler missing", one_shot(target={"pool": "demo"}), 422, "target.handler"),
    ("target missing", {k: v for k, v in one_shot().items() if k != "target"}, 422, "target"),
    ("name empty", one_shot(name=""), 422, "name"),
    ("name too long", one_shot(name="n" * 201), 422, "name"),
    ("type unknown", one_shot(type="WEEKLY"), 422, "type"),
    ("CRON without its schedule", one_shot(type="CRON", runAt=None), 422, "schedule"),
    ("runAt not an instant", one_shot(runAt="tomorrow at noon"), 422, "runAt"),
    ("runAt impossible date", one_shot(runAt="2030-02-30T10:00:00Z"), 422, "runAt"),
    ("runAt a date only", one_shot(runAt="2030-02-01"), 422, "runAt"),
    ("runAt a number", one_shot(runAt=1900000000), 422, "runAt"),
    ("runAt missing", {k: v for k, v in one_shot().items() if k != "runAt"}, 422, "runAt"),
    ("runAt long past", one_shot(runAt=rfc3339(NOW - timedelta(seconds=61))), 422, "runAt"),
    ("delaySeconds on ONE_SHOT", one_shot(delaySeconds=5), 422, "delaySeconds"),
    ("runAt on DELAYED", delayed(runAt=rfc3339(NOW)), 422, "runAt"),
    ("delaySeconds missing", {k: v for k, v in delayed().items() if k != "delaySeconds"}, 422, "delaySeconds"),
    ("delaySeconds negative", delayed(delaySeconds=-1), 422, "delaySeconds"),
    ("delaySeconds over ten years", delayed(delaySeconds=10 * 366 * 86400), 422, "delaySeconds"),
    ("delaySeconds a string", delayed(delaySeconds="60"), 422, "delaySeconds"),
    ("timezone unknown", one_shot(timezone="Mars/Olympus_Mons"), 422, "timezone"),
    ("maxAttempts zero", one_shot(retryPolicy={"maxAttempts": 0}), 422, "retryPolicy.maxAttempts"),
    ("backoff unknown", one_shot(retryPolicy={"backoff": "RANDOM"}), 422, "retryPolicy.backoff"),
    (
        "maxDelayMs below initial",
        one_shot(retryPolicy={"initialDelayMs": 5000, "maxDelayMs": 10}),
        422,
        "retryPolicy.maxDelayMs",
    ),
    ("timeoutSec zero", one_shot(timeoutSec=0), 422, "timeoutSec"),
    ("priority unknown", one_shot(priority="URGENT"), 422, "priority"),
    ("payload not an object", one_shot(payload=[1, 2]), 422, "payload"),
    ("payload integer beyond 64 bits", one_shot(payload={"n": 2**70}), 422, "payload"),
    (
        "payload nested too deep",
        one_shot(payload=orjson.loads(b'{"a":' * 300 + b"{}" + b"}" * 300)),
        422,
        "payload",
    ),
    ("payload with NUL", one_shot(payload={"s": "a\u0000b"}), 422, "payload"),
    ("name with NUL", one_shot(name="a\u0000b"), 422, "name"),
    ("payload over the limit", one_shot(payload={"blob": "x" * (256 * 1024)}), 413, "payload"),
]


@pytest.mark.parametrize(("case", "body", "status", "field"), BAD_BODIES, ids=[c[0] for c in BAD_BODIES])
async def test_bad_input_names_the_field_and_writes_nothing(
    api: Api, case: str, body: dict[str, Any], status: int, field: str
) -> None:
    before = await api.counts()
    response = await api.create(body)

    assert response.status_code == status, response.text
    assert field in error_fields(response), response.text
    assert await api.counts() == before == {"jobs": 0, "audit_log": 0, "executions": 0}
    assert await api.redis.dbsize() == 0


async def test_validation_errors_help_fix_the_request(api: Api) -> None:
    snake = (await api.create({**one_shot(), "runAt": None, "run_at": rfc3339(NOW)})).json()["errors"]
    assert {"field": "run_at", "message": "unknown field; did you mean `runAt`?"} in snake
    zone = (await api.create(one_shot(timezone="america/new_york"))).json()["errors"]
    assert zone == [
        {"field": "timezone", "message": "unknown time zone `america/new_york`; did you mean `America/New_York`?"}
    ]
    several = await api.create(one_shot(name="", priority="URGENT", target={"pool": "demo", "handler": "-"}))
    assert sorted(error_fields(several)) == ["name", "priority", "target.handler"]


@pytest.mark.parametrize(
    ("content", "content_type", "status", "field"),
    [
        (b'{"name": "x", "type": ', "application/json", 422, "body"),
        (b"[1, 2, 3]", "application/json", 422, "body"),
        (b"", "application/json", 422, "body"),
        (b"name=x", "application/x-www-form-urlencoded", 422, "body"),
        (b'{"payload": "' + b"x" * (1024 * 1024) + b'"}', "application/json", 413, "body"),
    ],
    ids=["malformed JSON", "not an object", "empty", "not JSON", "over 1 MiB"],
)
async def test_an_unreadable_body_is_named_and_writes_nothing(
    api: Api, content: bytes, content_type: str, status: int, field: str
) -> None:
    response = await api.client.post("/v1/jobs", content=content, headers={**api.auth(), "Content-Type": content_type})

    assert response.status_code == status, response.text
    assert field in error_fields(response)
    assert (await api.counts())["jobs"] == 0


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "Application/JSON", "application/x+json"]
)
async def test_any_json_content_type_is_read_alike(api: Api, content_type: str) -> None:
    # `application/json` takes the create route's direct path, the others FastAPI's: the answers are the same.
    headers = {**api.auth(), "Content-Type": content_type}
    created = await api.client.post("/v1/jobs", content=orjson.dumps(delayed(name="ok")), headers=headers)
    invalid = await api.client.post("/v1/jobs", content=orjson.dumps(delayed(name="", priority="X")), headers=headers)
    batch = await api.client.post(
        "/v1/jobs:batch", content=orjson.dumps({"jobs": [delayed(name="b"), delayed(name="")]}), headers=headers
    )
    anonymous = await api.client.post(
        "/v1/jobs", content=orjson.dumps(delayed()), headers={"Content-Type": content_type}
    )

    assert created.status_code == 201 and created.json()["name"] == "ok", created.text
    assert invalid.status_code == 422 and sorted(error_fields(invalid)) == ["name", "priority"], invalid.text
    assert [r["status"] for r in batch.json()["results"]] == [201, 422], batch.text
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"].startswith("Bearer")
    assert (await api.counts())["jobs"] == 2


async def test_a_chunked_body_is_limited_too(api: Api) -> None:
    async def chunks(data: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
        for start in range(0, len(data), size):
            yield data[start : start + size]

    headers = {**api.auth(), "Content-Type": "application/json"}
    small = await api.client.post("/v1/jobs", content=chunks(orjson.dumps(delayed())), headers=headers)
    large = await api.client.post(
        "/v1/jobs", content=chunks(orjson.dumps(delayed(payload={"x": "y" * (1024 * 1024)}))), headers=headers
    )

    assert small.status_code == 201, small.text
    assert large.status_code == 413 and error_fields(large) == ["body"]
    assert (await api.counts())["jobs"] == 1


# --- authentication and tenancy --------------------------------------------------------------------


def forged(claims: dict[str, Any], secret: str = SECRET) -> str:
    base = {"iss": "sundial", "sub": "svc", "tenant": TENANT, "exp": int(time.time()) + 60}
    return jwt.encode({**base, **claims}, secret, algorithm="HS256")


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Basic dXNlcjpwYXNz",
        "Bearer not-a-jwt",
        f"Bearer {forged({}, secret='another-signing-key-that-is-long-enough')}",
        f"Bearer {forged({'exp': int(time.time()) - 10})}",
        f"Bearer {forged({'tenant': None})}",
        f"Bearer {forged({'tenant': '../etc'})}",
    ],
    ids=["missing", "basic", "garbage", "wrong key", "expired", "no tenant", "bad tenant"],
)
async def test_requests_without_a_valid_token_get_401_and_write_nothing(api: Api, authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    for method, path in [
        ("POST", "/v1/jobs"),
        ("GET", f"/v1/jobs/{uuid.uuid4()}"),
        ("GET", f"/v1/executions/{uuid.uuid4()}"),
        ("DELETE", f"/v1/jobs/{uuid.uuid4()}"),
    ]:
        response = await api.client.request(
            method, path, json=one_shot() if method == "POST" else None, headers=headers
        )
        assert response.status_code == 401, (method, path, response.text)
        assert response.headers["www-authenticate"].startswith("Bearer")
        error_fields(response)
    assert (await api.counts())["jobs"] == 0


async def test_another_tenants_jobs_and_executions_are_not_found(api: Api) -> None:
    job = (await api.create(one_shot())).json()
    execution_id = await insert_execution(api, job["jobId"], NOW)
    intruder = api.auth("globex")

    for method, path in [
        ("GET", f"/v1/jobs/{job['jobId']}"),
        ("GET", f"/v1/jobs/{job['jobId']}/executions"),
        ("DELETE", f"/v1/jobs/{job['jobId']}"),
        ("GET", f"/v1/executions/{execution_id}"),
    ]:
        response = await api.client.request(method, path, headers=intruder)
        assert response.status_code == 404, (method, path)
        error_fields(response)
    assert await api.db.fetchval("SELECT state FROM jobs") == "ACTIVE"


# A fixed unknown id: under xdist every worker must collect the same test ids.
@pytest.mark.parametrize("ident", ["0b7f3c52-9d1e-4a8f-b6c2-5e4d3a2f1c0b", "not-a-uuid", "1"])
async def test_unknown_and_malformed_ids_are_not_found(api: Api, ident: str) -> None:
    for method, path in [
        ("GET", f"/v1/jobs/{ident}"),
        ("GET", f"/v1/jobs/{ident}/executions"),
        ("DELETE", f"/v1/jobs/{ident}"),
        ("GET", f"/v1/executions/{ident}"),
    ]:
        response = await api.client.request(method, path, headers=api.auth())
        assert response.status_code == 404, (method, path, response.text)
        error_fields(response)


# --- reading --------------------------------------------------------------------------------------


async def test_get_job_returns_it_with_its_latest_executions(api: Api) -> None:
    job = (await api.create(one_shot())).json()
    for i in range(12):
        await insert_execution(api, job["jobId"], NOW - timedelta(minutes=i))

    response = await api.client.get(f"/v1/jobs/{job['jobId']}", headers=api.auth())

    assert response.status_code == 200
    detail = response.json()
    JobDetail.model_validate(detail)
    job.pop("warnings")  # the create's answer says no worker serves the pool; a read does not repeat it
    assert detail["latestExecutionState"] == detail["latestExecutions"][0]["state"]
    about_executions = ("latestExecutions", "latestExecutionState", "parents", "children")
    assert {k: v for k, v in detail.items() if k not in about_executions} == {
        k: v for k, v in job.items() if k != "latestExecutionState"
    }
    assert (detail["parents"], detail["children"]) == ([], [])  # no dependencies
    scheduled = [e["scheduledFor"] for e in detail["latestExecutions"]]
    assert scheduled == [rfc3339(NOW - timedelta(minutes=i)) for i in range(10)]


async def test_executions_are_paged_newest_first_with_an_opaque_cursor(api: Api) -> None:
    job = (await api.create(delayed())).json()
    other = (await api.create(delayed())).json()
    await insert_execution(api, other["jobId"], NOW)  # another job's: never listed here
    expected = [await insert_execution(api, job["jobId"], NOW - timedelta(seconds=i)) for i in range(7)]

    pages: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        response = await api.client.get(f"/v1/jobs/{job['jobId']}/executions", params=params, headers=api.auth())
        assert response.status_code == 200, response.text
        ExecutionPage.model_validate(response.json())
        pages.append(response.json())
        cursor = response.json()["nextCursor"]
        if cursor is None:
            break

    assert [len(p["items"]) for p in pages] == [3, 3, 1]
    assert [item["executionId"] for p in pages for item in p["items"]] == [str(e) for e in expected]

    # Exactly a page's worth left: the last full page says there is no more.
    exact = await api.client.get(f"/v1/jobs/{job['jobId']}/executions", params={"limit": 7}, headers=api.auth())
    assert len(exact.json()["items"]) == 7 and exact.json()["nextCursor"] is None


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"cursor": "not-a-cursor!"}, "cursor"),
        ({"cursor": base64.urlsafe_b64encode(b"v1:abc:def").decode().rstrip("=")}, "cursor"),
        ({"limit": 0}, "limit"),
        ({"limit": 201}, "limit"),
        ({"limit": "many"}, "limit"),
    ],
)
async def test_bad_paging_parameters_are_named(api: Api, params: dict[str, Any], field: str) -> None:
    job = (await api.create(delayed())).json()
    response = await api.client.get(f"/v1/jobs/{job['jobId']}/executions", params=params, headers=api.auth())

    assert response.status_code == 422, response.text
    assert error_fields(response) == [field]


async def test_get_execution_tells_its_whole_story(api: Api) -> None:
    job = (await api.create(one_shot())).json()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    execution_id = await insert_execution(
        api,
        job["jobId"],
        NOW,
        state="FAILED",
        attempt=2,
        max_attempts=3,
        worker_id="worker-b",
        trace_id=trace_id,
        error="boom",
        started_at=NOW + timedelta(seconds=1),
        finished_at=NOW + timedelta(seconds=2),
    )
    for attempt, worker in ((1, "worker-a"), (2, "worker-b")):
        await api.db.execute(
            "INSERT INTO execution_attempts (execution_id, attempt, tenant_id, worker_id, state, started_at,"
            " finished_at, error, progress) VALUES ($1, $2, $3, $4, 'FAILED', $5, $6, 'boom', $7)",
            execution_id,
            attempt,
            TENANT,
            worker,
            NOW,
            NOW + timedelta(seconds=1),
            orjson.dumps({"done": attempt}).decode(),
        )

    response = await api.client.get(f"/v1/executions/{execution_id}", headers=api.auth())

    assert response.status_code == 200
    execution = response.json()
    ExecutionDetail.model_validate(execution)
    assert execution["executionId"] == str(execution_id) and execution["jobId"] == job["jobId"]
    assert (execution["state"], execution["attempt"], execution["maxAttempts"]) == ("FAILED", 2, 3)
    assert (execution["workerId"], execution["error"], execution["fenceToken"]) == ("worker-b", "boom", 7)
    assert execution["scheduledFor"] == rfc3339(NOW)
    assert execution["traceId"] == trace_id
    # No trace backend configured (no OTLP endpoint): a link would lead to a Jaeger nobody started.
    assert execution["traceLink"] is None
    assert [(a["attempt"], a["workerId"], a["progress"]) for a in execution["attempts"]] == [
        (1, "worker-a", {"done": 1}),
        (2, "worker-b", {"done": 2}),
    ]


@pytest.mark.parametrize(
    "api",
    [{"otlp_endpoint": "http://collector:4318/v1/traces", "trace_link_template": "http://jaeger/t/{trace_id}"}],
    indirect=True,
)
async def test_an_execution_links_its_trace_when_traces_are_exported(api: Api) -> None:
    job = (await api.create(one_shot())).json()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    execution_id = await insert_execution(api, job["jobId"], NOW, trace_id=trace_id)

    execution = (await api.client.get(f"/v1/executions/{execution_id}", headers=api.auth())).json()
    listed = (await api.client.get(f"/v1/jobs/{job['jobId']}/executions", headers=api.auth())).json()["items"]
    detail = (await api.client.get(f"/v1/jobs/{job['jobId']}", headers=api.auth())).json()["latestExecutions"]

    link = f"http://jaeger/t/{trace_id}"
    assert (execution["traceId"], execution["traceLink"]) == (trace_id, link)
    assert [e["traceLink"] for e in listed] == [link] and [e["traceLink"] for e in detail] == [link]


@pytest.mark.parametrize(
    "api", [{"otlp_endpoint": "http://collector:4318/v1/traces", "trace_link_template": ""}], indirect=True
)
async def test_an_empty_link_template_means_no_trace_link(api: Api) -> None:
    job = (await api.create(one_shot())).json()
    execution_id = await insert_execution(api, job["jobId"], NOW, trace_id="ab" * 16)

    execution = (await api.client.get(f"/v1/executions/{execution_id}", headers=api.auth())).json()

    assert (execution["traceId"], execution["traceLink"]) == ("ab" * 16, None)


async def test_the_api_serves_its_metrics(api: Api) -> None:
    response = await api.client.get("/metrics")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    # The process collector and Sundial's own loop metrics, from the one registry every process serves.
    assert "process_cpu_seconds_total" in response.text
    assert "# TYPE sundial_loop_passes_total counter" in response.text
    # Prometheus' text format, not part of the JSON API.
    assert "/metrics" not in (await api.client.get("/openapi.json")).json()["paths"]


# --- cancelling -----------------------------------------------------------------------------------


async def test_delete_cancels_the_job_and_takes_it_out_of_the_hot_window(api: Api) -> None:
    job = (await api.create(one_shot())).json()
    shard = await api.db.fetchval("SELECT shard FROM jobs WHERE id = $1", uuid.UUID(job["jobId"]))
    assert await api.score(shard, job["jobId"]) is not None

    first = await api.client.delete(f"/v1/jobs/{job['jobId']}", headers=api.auth())
    again = await api.client.delete(f"/v1/jobs/{job['jobId']}", headers=api.auth())

    assert first.status_code == 200 and again.status_code == 200
    assert first.json()["state"] == "CANCELLED" and first.json()["nextFireAt"] is None
    assert first.json()["version"] == 2
    assert again.json() == first.json()  # idempotent: no second change, no second audit row
    assert await api.score(shard, job["jobId"]) is None
    actions = await api.db.fetch(
        "SELECT action FROM audit_log WHERE entity_id = $1 ORDER BY id", uuid.UUID(job["jobId"])
    )
    assert [a["action"] for a in actions] == ["create", "cancel"]


async def test_a_completed_job_cannot_be_cancelled(api: Api) -> None:
    job = (await api.create(one_shot())).json()
    await api.db.execute("UPDATE jobs SET state = 'COMPLETED', next_fire_at = NULL")

    response = await api.client.delete(f"/v1/jobs/{job['jobId']}", headers=api.auth())

    assert response.status_code == 409
    error_fields(response)
    assert await api.db.fetchval("SELECT state FROM jobs") == "COMPLETED"


# --- probes, documentation, tracing ---------------------------------------------------------------


async def test_probes_answer_without_a_token(api: Api) -> None:
    assert (await api.client.get("/healthz")).json() == {"status": "ok"}
    ready = await api.client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "checks": {"postgres": "ok", "redis": "ok"}}
    assert (await api.client.get("/version")).json() == {"version": version("sundial-common")}


async def test_openapi_documents_the_api(api: Api) -> None:
    response = await api.client.get("/openapi.json")

    assert response.status_code == 200
    spec = response.json()
    assert spec["info"]["title"] == "Sundial"
    assert {
        "/v1/jobs",
        "/v1/jobs/{job_id}",
        "/v1/jobs/{job_id}/executions",
        "/v1/jobs/{job_id}/pause",
        "/v1/jobs/{job_id}/resume",
        "/v1/jobs/{job_id}/trigger",
        "/v1/jobs/{job_id}/preview",
        "/v1/schedules:preview",
        "/v1/executions/{execution_id}",
        "/v1/jobs/{job_id}:backfill",
        "/v1/backfills/{backfill_id}",
        "/v1/backfills/{backfill_id}/cancel",
        "/v1/breakers",
        "/v1/breakers/{breaker_id}:open",
        "/v1/breakers/{breaker_id}:close",
        "/healthz",
        "/readyz",
    } <= set(spec["paths"])
    assert "patch" in spec["paths"]["/v1/jobs/{job_id}"]
    create = spec["paths"]["/v1/jobs"]["post"]
    assert "Idempotency-Key" in [p["name"] for p in create["parameters"]]
    assert create["responses"]["422"]["content"]["application/problem+json"]["schema"]["$ref"].endswith("/Problem")
    job_create = spec["components"]["schemas"]["JobCreate"]
    assert {
        "name",
        "type",
        "runAt",
        "delaySeconds",
        "timezone",
        "target",
        "payload",
        "retryPolicy",
        "timeoutSec",
        "priority",
        "schedule",
        "intervalSec",
        "runList",
        "startAt",
        "endAt",
        "maxRuns",
        "jitterSec",
        "overlapPolicy",
        "catchupPolicy",
        "catchupWindowSec",
        "labels",
        "breaker",
        "dependsOn",
    } == set(job_create["properties"])
    assert job_create["additionalProperties"] is False
    assert spec["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"


async def test_the_request_span_continues_the_callers_trace_and_the_job_keeps_it(
    api: Api, spans: InMemorySpanExporter
) -> None:
    caller_trace = "0af7651916cd43dd8448eb211c80319c"
    incoming = f"00-{caller_trace}-b7ad6b7169203331-01"

    response = await api.client.post("/v1/jobs", json=one_shot(), headers={**api.auth(), "traceparent": incoming})

    assert response.status_code == 201
    stored = await api.db.fetchval("SELECT traceparent FROM jobs")
    # Exactly one SERVER span per request: FastAPI's built-in instrumentation is off.
    assert [s.name for s in spans.get_finished_spans()] == ["POST /v1/jobs"]
    (span,) = spans.get_finished_spans()
    assert span.kind == trace.SpanKind.SERVER
    assert format(span.context.trace_id, "032x") == caller_trace
    assert span.parent is not None and format(span.parent.span_id, "016x") == "b7ad6b7169203331"
    assert stored == f"00-{caller_trace}-{format(span.context.span_id, '016x')}-01"
    attributes = dict(span.attributes or {})
    assert attributes["http.route"] == "/v1/jobs"
    assert attributes["http.response.status_code"] == 201

    await api.client.get(f"/v1/jobs/{response.json()['jobId']}", headers=api.auth())
    assert "GET /v1/jobs/{job_id}" in [s.name for s in spans.get_finished_spans()]
