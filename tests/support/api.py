"""The HTTP API in process for the integration tests: the ``api`` fixture and the bodies and checks its tests share.

``api`` runs the app on the test's fresh database and flushed Redis, inside its lifespan, on a :class:`FakeClock` at
:data:`NOW`, with the tenants :data:`TENANT`, ``other`` and ``globex`` admitted to :data:`POOLS`; a test's own
settings come by indirect parametrization. :class:`Api` gives a test the client, a connection to the database and
Redis, to check what was written as well as what was answered.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis
from sundial_api import ApiSettings, create_app
from sundial_api.models.common import Problem
from sundial_common.domain.ids import new_id
from sundial_common.hotwindow.window import member
from sundial_common.testing import FakeClock

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


@asynccontextmanager
async def serving_api(
    database_url: str, redis_url: str, *, now: datetime = NOW, **overrides: Any
) -> AsyncIterator[Api]:
    """The app with ``overrides`` of its settings, on a :class:`FakeClock` at ``now``, inside its lifespan."""
    settings = ApiSettings(database_url=database_url, redis_url=redis_url, jwt_secret=SECRET, shards=4, **overrides)
    clock = FakeClock(now)
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


@pytest.fixture
async def api(request: pytest.FixtureRequest, database_url: str, redis_url: str) -> AsyncIterator[Api]:
    overrides: dict[str, Any] = getattr(request, "param", {})  # settings of a test's own (indirect parametrize)
    async with serving_api(database_url, redis_url, **overrides) as served:
        yield served


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
