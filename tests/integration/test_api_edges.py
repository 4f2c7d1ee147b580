"""Input a fuzzer never sends, each answered with a 4xx naming the field or the limit — never a 5xx — and nothing
written: bodies nested past the parser's limit (and payloads nested within it), lone surrogates and NUL characters
in every kind of field, query filter and id, cron steps past their field, a DEPENDENT item in a batch, a garbage
token, a 10 MB body sent without ``Expect``, hostile values in every parameter of every operation, and the
OpenAPI document's promises (bounds as JSON Schema, empty cursors, ``OPTIONS``).

In-process API on real Postgres and Redis (the ``api`` fixture of ``test_api``); the 413 goes through a real
uvicorn socket, where a reset would lose it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from typing import Any

import httpx
import pytest
import uvicorn
from sundial_api import ApiSettings, create_app
from sundial_common.security.auth import issue_token

from tests.support.api import SECRET, Api, api, delayed, error_fields

__all__ = ["api"]  # the fixture

DEEP = 1100  # past orjson's 1,024 and Python's recursion limit alike
SURROGATE = "\ud800"
NUL = "\u0000"


def deep_body() -> bytes:
    return b'{"name": "x", "payload": ' + b"[" * DEEP + b"]" * DEEP + b"}"


def cron(**overrides: Any) -> dict[str, Any]:
    return delayed(**{"type": "CRON", "delaySeconds": None, "schedule": "*/5 * * * *", **overrides})


async def refused(api: Api, response: httpx.Response, status: int, field: str, before: dict[str, int]) -> None:
    assert response.status_code == status, response.text
    assert field in error_fields(response), response.text
    assert await api.counts() == before  # nothing written


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/jobs:batch", "/v1/schedules:preview"])
@pytest.mark.parametrize("token", [False, True])
async def test_a_body_nested_past_the_limit_is_a_400_with_or_without_a_token(api: Api, path: str, token: bool) -> None:
    before = await api.counts()
    headers = {"Content-Type": "application/json", **(api.auth() if token else {})}
    response = await api.client.post(path, content=deep_body(), headers=headers)
    await refused(api, response, 400, "body", before)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (delayed(labels={"env": SURROGATE}), "labels.env"),
        (delayed(target={"pool": SURROGATE, "handler": "echo"}), "target.pool"),
        (delayed(target={"pool": "demo", "handler": "a" + SURROGATE}), "target.handler"),
        (cron(timezone=SURROGATE), "timezone"),
        (delayed(type="ONE_SHOT", delaySeconds=None, runAt="2030-01-01T00:00:00" + SURROGATE), "runAt"),
        (cron(schedule="*/5 * * * " + SURROGATE), "schedule"),
        (delayed(name="a" + NUL), "name"),
        (delayed(labels={"env": NUL}), "labels.env"),
    ],
)
async def test_text_postgres_cannot_store_is_a_422_naming_the_field_everywhere(
    api: Api, body: dict[str, Any], field: str
) -> None:
    before = await api.counts()

    # json.dumps writes a lone surrogate as its escape, valid JSON (httpx's encoder would refuse it).
    def send(path: str, value: Any, method: str = "POST") -> Any:
        content = json.dumps(value).encode()
        headers = {"Content-Type": "application/json", **api.auth()}
        return api.client.request(method, path, content=content, headers=headers)

    await refused(api, await send("/v1/jobs", body), 422, field, before)
    await refused(api, await send("/v1/jobs:batch", {"jobs": [delayed(), body]}), 422, f"jobs[1].{field}", before)
    preview = {k: v for k, v in body.items() if k in ("type", "schedule", "timezone", "runAt", "delaySeconds")}
    if any(field.startswith(k) for k in preview):
        await refused(api, await send("/v1/schedules:preview", preview), 422, field, before)

    created = await api.create(delayed())
    assert created.status_code == 201, created.text
    before = await api.counts()
    patch = {k: v for k, v in body.items() if field.split(".")[0] == k}
    response = await send(f"/v1/jobs/{created.json()['jobId']}", patch, method="PATCH")
    await refused(api, response, 422, field, before)


@pytest.mark.parametrize(
    "query",
    [
        "/v1/jobs?label=env:a%00b",
        "/v1/jobs?namePrefix=%00",
        "/v1/jobs?pool=a%00",
        "/v1/jobs?handler=%00x",
        "/v1/executions?pool=a%00",
        "/v1/executions?handler=%00",
        "/v1/breakers?pool=%00",
    ],
)
async def test_a_nul_in_a_query_filter_is_a_422_naming_it(api: Api, query: str) -> None:
    response = await api.client.get(query, headers=api.auth())
    assert response.status_code == 422, response.text
    assert error_fields(response) == [query.split("?")[1].split("=")[0]]


async def test_a_nul_in_an_admin_id_or_body_is_a_4xx(api: Api) -> None:
    admin = {"Authorization": f"Bearer {issue_token(SECRET, 'ops', admin=True)}"}
    before = await api.counts()
    assert (await api.client.get("/v1/admin/tenants/a%00b", headers=admin)).status_code == 404
    assert (await api.client.post("/v1/admin/tenants/a%00b/suspend", headers=admin)).status_code == 404
    response = await api.client.post("/v1/admin/tenants", json={"id": "a", "displayName": NUL}, headers=admin)
    await refused(api, response, 422, "displayName", before)


@pytest.mark.parametrize("schedule", ["*/61 * * * *", "*/99999999999999999999 * * * *", "0 */25 * * *"])
async def test_a_cron_step_past_its_field_is_a_422(api: Api, schedule: str) -> None:
    before = await api.counts()
    await refused(api, await api.create(cron(schedule=schedule)), 422, "schedule", before)


async def test_a_dependent_item_in_a_batch_is_refused_alone(api: Api) -> None:
    parent = (await api.create(delayed())).json()["jobId"]
    dependent = {
        "name": "child",
        "type": "DEPENDENT",
        "dependsOn": [{"jobId": parent}],
        "target": {"pool": "demo", "handler": "echo"},
    }
    response = await api.client.post("/v1/jobs:batch", json={"jobs": [delayed(), dependent]}, headers=api.auth())
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["status"] for r in results] == [201, 422]
    assert [e["field"] for e in results[1]["problem"]["errors"]] == ["type"]
    assert await api.db.fetchval("SELECT count(*) FROM jobs WHERE name = 'child'") == 0


@pytest.mark.parametrize(
    "token", [b"garbage", b"a.b.c", b"\xb7\xb7.\xb7", b"eyJhbGciOiJIUzI1NiJ9.t2s.x", b"t7c.t7c.t7c"]
)
async def test_a_malformed_token_is_a_plain_401(api: Api, token: bytes) -> None:
    response = await api.client.get("/v1/jobs", headers={b"Authorization": b"Bearer " + token})
    assert response.status_code == 401
    assert response.json()["detail"] == "malformed bearer token"


async def test_an_empty_cursor_is_the_first_page(api: Api) -> None:
    job = (await api.create(delayed())).json()["jobId"]
    for path in ("/v1/jobs?cursor=", "/v1/executions?cursor=&limit=5", f"/v1/jobs/{job}/audit?cursor="):
        response = await api.client.get(path, headers=api.auth())
        assert response.status_code == 200, (path, response.text)
    assert len((await api.client.get("/v1/jobs?cursor=", headers=api.auth())).json()["items"]) == 1


async def test_options_on_an_action_lists_its_own_method(api: Api) -> None:
    for path in (f"/v1/breakers/{uuid.uuid4()}:open", f"/v1/breakers/{uuid.uuid4()}:close"):
        response = await api.client.options(path, headers=api.auth())
        assert response.status_code == 405 and response.headers["allow"] == "POST", (path, response.headers)
    response = await api.client.options(f"/v1/jobs/{uuid.uuid4()}:backfill", headers=api.auth())
    assert response.headers["allow"] == "POST"


async def test_the_openapi_document_states_bounds_in_json_schema_terms(api: Api) -> None:
    document = (await api.client.get("/openapi.json")).json()
    found: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            found.extend(f"{path}/{k}" for k in node if k in ("gt", "ge", "lt", "le"))
            for key, child in node.items():
                walk(child, f"{path}/{key}")
        elif isinstance(node, list):
            for i, child in enumerate(node):
                walk(child, f"{path}[{i}]")

    walk(document, "")
    assert found == []
    schemas = document["components"]["schemas"]
    assert schemas["QuotasBody"]["properties"]["maxCreatesPerSec"]["anyOf"][0]["exclusiveMinimum"] == 0
    assert all("anyOf" in field for field in schemas["JobPatch"]["properties"].values())
    patch = document["paths"]["/v1/jobs/{job_id}"]["patch"]["responses"]
    assert "400" in patch


async def test_a_10_mb_body_without_expect_gets_a_readable_413(unused_port: int) -> None:
    app = create_app(ApiSettings(jwt_secret=SECRET, max_request_bytes=1_000_000))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=unused_port, lifespan="off", log_level="error"))
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:  # noqa: ASYNC110 - uvicorn offers no event for it
            await asyncio.sleep(0.02)
        reader, writer = await asyncio.open_connection("127.0.0.1", unused_port)
        size = 10 * 1024 * 1024
        writer.write(
            f"POST /v1/jobs HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\n\r\n".encode()
        )
        chunk = b" " * 65536
        for _ in range(size // len(chunk)):
            writer.write(chunk)
            await writer.drain()
        answer = await asyncio.wait_for(reader.read(65536), timeout=30)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"larger than 1000000 bytes" in answer
        writer.close()
    finally:
        server.should_exit = True
        await serving


@pytest.fixture
def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


#: What schemathesis never puts in a parameter: a NUL, a lone surrogate (its UTF-8 bytes), a number past 64 bits.
HOSTILE = ("a%00b", "%ED%A0%80", "9" * 30)


async def test_no_parameter_of_any_operation_answers_5xx_to_what_a_fuzzer_never_sends(api: Api) -> None:
    document = (await api.client.get("/openapi.json")).json()
    admin = {"Authorization": f"Bearer {issue_token(SECRET, 'ops', admin=True)}"}
    job = (await api.create(delayed())).json()["jobId"]
    sent = 0
    for template, item in document["paths"].items():
        for method, operation in item.items():
            parameters = [p for p in operation.get("parameters", []) if p["in"] in ("query", "path")]
            headers = admin if template.startswith("/v1/admin") else api.auth()
            for target in parameters:
                for value in HOSTILE:
                    path = template
                    for p in parameters:
                        if p["in"] == "path":
                            path = path.replace("{" + p["name"] + "}", value if p is target else job)
                    query = f"?{target['name']}={value}" if target["in"] == "query" else ""
                    response = await api.client.request(method.upper(), path + query, headers=headers)
                    sent += 1
                    assert response.status_code < 500, (method, path + query, response.text)
    assert sent > 100  # every operation's parameters were tried


@pytest.mark.parametrize("depth", [300, 1000])
async def test_a_payload_nested_within_the_parsers_limit_is_refused_by_itself(api: Api, depth: int) -> None:
    # Parsed (orjson takes 1,024 levels) but not storable (jsonb, and orjson's writer, take 255): a 422 naming the
    # payload — also where the request is hashed for its Idempotency-Key, which writes the body back out.
    payload = b"[" * depth + b"]" * depth
    item = json.dumps(delayed(payload=None)).encode().replace(b'"payload": null', b'"payload": ' + payload)
    before = await api.counts()
    for key in (None, f"deep-{depth}"):
        headers = {"Content-Type": "application/json", **api.auth(), **({"Idempotency-Key": key} if key else {})}
        single = await api.client.post("/v1/jobs", content=item, headers=headers)
        await refused(api, single, 422, "payload", before)
        batch = await api.client.post("/v1/jobs:batch", content=b'{"jobs": [' + item + b"]}", headers=headers)
        assert batch.status_code == 200, batch.text
        [result] = batch.json()["results"]
        assert result["status"] == 422 and result["problem"]["errors"][0]["field"] == "payload", result
    assert (await api.counts())["jobs"] == before["jobs"]
