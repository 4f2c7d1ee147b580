"""What the HTTP API refuses, on real Postgres and Redis: bad bodies, unreadable requests, missing or forged
tokens, another tenant's and unknown ids.

Each refusal answers a problem document with the right status that names the field, and writes nothing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import jwt
import orjson
import pytest

from tests.support.api import NOW, SECRET, TENANT, Api, api, delayed, error_fields, insert_execution, one_shot, rfc3339

__all__ = ["api"]  # the fixtures


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
