"""`POST /v1/jobs:batch`: many jobs in one request, a result per item, bad items rejected alone."""

from __future__ import annotations

import uuid

import orjson

from tests.support.api import NOW, Api, api, delayed, one_shot  # noqa: F401  (the `api` fixture)


async def test_a_batch_registers_the_valid_items_and_names_the_field_of_each_invalid_one(api: Api) -> None:  # noqa: F811
    items = [one_shot(name=f"job-{i}") for i in range(5)]
    items.insert(2, one_shot(target={"pool": "Bad Pool!", "handler": "x"}))
    items.insert(4, delayed(delaySeconds=-1))
    items.append({**one_shot(), "unknownField": 1})

    response = await api.client.post("/v1/jobs:batch", json={"jobs": items}, headers=api.auth())

    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["created"], body["failed"]) == (5, 3)
    statuses = [r["status"] for r in body["results"]]
    assert statuses == [201, 201, 422, 201, 422, 201, 201, 422]
    assert [r["index"] for r in body["results"]] == list(range(8))
    fields = [r["problem"]["errors"][0]["field"] for r in body["results"] if r["status"] == 422]
    assert fields == ["target.pool", "delaySeconds", "unknownField"]
    created = [r["job"] for r in body["results"] if r["status"] == 201]
    assert [j["name"] for j in created] == [f"job-{i}" for i in range(5)]
    # Exactly the valid ones are stored, audited and in the hot window.
    counts = await api.counts()
    assert (counts["jobs"], counts["audit_log"]) == (5, 5)
    shards = {row["id"]: row["shard"] for row in await api.db.fetch("SELECT id, shard FROM jobs")}
    for job in created:
        assert await api.score(shards[uuid.UUID(job["jobId"])], job["jobId"]) is not None


async def test_a_batch_has_a_size_limit_and_needs_a_token(api: Api) -> None:  # noqa: F811
    too_many = await api.client.post("/v1/jobs:batch", json={"jobs": [one_shot()] * 1001}, headers=api.auth())
    assert too_many.status_code in (413, 422)
    empty = await api.client.post("/v1/jobs:batch", json={"jobs": []}, headers=api.auth())
    assert empty.status_code == 422 and empty.json()["errors"][0]["field"] == "jobs"
    anonymous = await api.client.post("/v1/jobs:batch", json={"jobs": [one_shot()]})
    assert anonymous.status_code == 401
    assert (await api.counts())["jobs"] == 0
    assert NOW  # the suite's fixed clock is in force


async def test_a_batch_body_parses_as_the_standard_library_parses_it(api: Api) -> None:  # noqa: F811
    # orjson parses the body; what it refuses, json.loads parses or refuses as before.
    headers = {**api.auth(), "Content-Type": "application/json"}
    malformed = await api.client.post("/v1/jobs:batch", content=b'{"jobs": [', headers=headers)
    assert malformed.status_code == 422 and malformed.json()["errors"][0]["field"] == "body"
    item = delayed(name="big", payload={"n": 0})
    huge = orjson.dumps({"jobs": [item, delayed(name="fine")]}).replace(
        b'{"n":0}', b'{"n":123456789012345678901234567890}'
    )
    answer = await api.client.post("/v1/jobs:batch", content=huge, headers=headers)
    assert answer.status_code == 200, answer.text
    assert [r["status"] for r in answer.json()["results"]] == [422, 201]
    assert answer.json()["results"][0]["problem"]["errors"][0]["field"] == "payload"
