"""Job keys: a tenant's own unique name for a job. Registering the same job again under its key answers that job; a
different definition under a taken key is refused naming the key and the job; the job is readable and listed by
key; racing creates with one key leave one job. In-process API on real Postgres (the ``api`` fixture of
``tests.support.api``).
"""

from __future__ import annotations

import asyncio

from tests.support.api import Api, api, delayed

__all__ = ["api"]  # the fixture


def interval(**overrides: object) -> dict[str, object]:
    # No startAt: the server anchors the grid at "now", so two creates of this body store different columns.
    return {**delayed(name="poll", key="poll/orders"), "type": "INTERVAL", "intervalSec": 300, **overrides}


async def test_a_key_registers_one_job_and_a_repeat_answers_it(api: Api) -> None:
    body = interval()
    body.pop("delaySeconds")
    first = await api.create(body)
    assert first.status_code == 201, first.text
    job = first.json()
    assert job["key"] == "poll/orders"

    # The same body again (a deployment run twice): the registered job, nothing written.
    again = await api.create(body)
    assert again.status_code == 200, again.text
    assert again.json()["jobId"] == job["jobId"] and again.headers["location"] == f"/v1/jobs/{job['jobId']}"
    # A default written out is the same definition as a default left out.
    explicit = await api.create({**body, "priority": "NORMAL", "payload": {}})
    assert (explicit.status_code, explicit.json()["jobId"]) == (200, job["jobId"])

    # Another definition under the taken key: 409 naming the key and the job that holds it.
    clash = await api.create({**body, "intervalSec": 600})
    assert clash.status_code == 409, clash.text
    problem = clash.json()
    assert problem["errors"][0]["field"] == "key" and job["jobId"] in problem["detail"]
    assert problem["type"].endswith("job-key-taken")
    assert await api.db.fetchval("SELECT count(*) FROM jobs") == 1

    # The key is the tenant's own: another tenant registers its own job with it.
    theirs = await api.create(body, tenant="other")
    assert theirs.status_code == 201 and theirs.json()["jobId"] != job["jobId"]

    # Read by key, and found by key in the list.
    read = await api.client.get("/v1/jobs:by-key/poll/orders", headers=api.auth())
    assert read.status_code == 200 and read.json()["jobId"] == job["jobId"] and read.json()["latestExecutions"] == []
    await api.create(delayed(name="unkeyed"))
    listed = await api.client.get("/v1/jobs", params={"key": "poll/orders"}, headers=api.auth())
    assert [item["jobId"] for item in listed.json()["items"]] == [job["jobId"]]
    missing = await api.client.get("/v1/jobs:by-key/nope", headers=api.auth())
    assert missing.status_code == 404 and "nope" in missing.json()["detail"]


async def test_bad_keys_are_refused_naming_the_field(api: Api) -> None:
    for key in ("", "-lead", "has space", "x" * 201, "0190a0b2-7c1e-7000-8000-000000000000"):
        response = await api.create(delayed(key=key))
        assert response.status_code == 422, (key, response.text)
        assert response.json()["errors"][0]["field"] == "key"
    batch = await api.client.post("/v1/jobs:batch", json={"jobs": [delayed(key="k"), delayed()]}, headers=api.auth())
    assert [r["status"] for r in batch.json()["results"]] == [422, 201], batch.text
    assert batch.json()["results"][0]["problem"]["errors"][0]["field"] == "key"
    created = await api.create(delayed(key="fixed"))
    patched = await api.client.patch(f"/v1/jobs/{created.json()['jobId']}", json={"key": "other"}, headers=api.auth())
    assert patched.status_code == 422 and patched.json()["errors"][0]["field"] == "key"


async def test_racing_creates_with_one_key_leave_one_job(api: Api) -> None:
    same = await asyncio.gather(*(api.create(delayed(key="race")) for _ in range(8)))
    assert sorted(r.status_code for r in same) == [200] * 7 + [201], [r.text for r in same]
    assert len({r.json()["jobId"] for r in same}) == 1
    different = await asyncio.gather(*(api.create(delayed(key="race2", delaySeconds=60 + i)) for i in range(6)))
    assert sorted(r.status_code for r in different) == [201] + [409] * 5
    assert await api.db.fetchval("SELECT count(*) FROM jobs WHERE key IN ('race', 'race2')") == 2
