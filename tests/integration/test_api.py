"""A job's life through the HTTP API on real Postgres and Redis, driven in-process through its ASGI interface:
created, read with its executions, cancelled.

Each test gets a fresh migrated database and a flushed Redis (the ``api`` fixture of :mod:`tests.support.api`) and
checks what a client sees *and* what was written: the job row, the audit row, the hot-window member and its score.
"""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, timedelta
from typing import Any

import orjson
import pytest
from sundial_api.models.executions import ExecutionDetail, ExecutionPage
from sundial_api.models.jobs import JobDetail

from tests.support.api import NOW, TENANT, Api, api, delayed, error_fields, insert_execution, ms, one_shot, rfc3339

__all__ = ["api"]  # the fixtures


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
