"""``/v1/executions`` (cancel, retry, the dead-letter list) and ``Idempotency-Key`` on ``POST /v1/jobs``.

In-process API on real Postgres and Redis (the ``api`` fixture of ``tests.support.api``); each test checks what the
client sees and what was written — rows, audit, Redis flags and hot-window members.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sundial_api.models.executions import Execution, ExecutionList
from sundial_common.domain.ids import id_floor
from sundial_common.hotwindow.execution_signals import cancel_key
from sundial_common.hotwindow.window import retry_member
from sundial_common.runtime.clock import to_ms

from tests.support.api import NOW, TENANT, Api, api, error_fields, insert_execution, one_shot

__all__ = ["api"]  # the fixture


async def a_job(api: Api) -> str:
    response = await api.create(one_shot())
    assert response.status_code == 201, response.text
    return str(response.json()["jobId"])


async def state_of(api: Api, execution_id: uuid.UUID) -> str:
    return str(await api.db.fetchval("SELECT state FROM executions WHERE id = $1", execution_id))


# --- cancel ------------------------------------------------------------------------------------------


async def test_cancelling_a_pending_execution_cancels_it_at_once(api: Api) -> None:
    job_id = await a_job(api)
    ident = await insert_execution(api, job_id, NOW)
    response = await api.client.post(f"/v1/executions/{ident}/cancel", headers=api.auth())
    assert response.status_code == 200, response.text
    view = Execution.model_validate(response.json())
    assert view.state == "CANCELLED" and view.cancel_requested_at is not None
    # Its message may still be in Kafka: the worker's PENDING → RUNNING swap now fails, so it never runs.
    assert await api.db.fetchval(
        "SELECT count(*) FROM audit_log WHERE entity_id = $1 AND action = 'cancel' AND from_state = 'PENDING'", ident
    )


async def test_cancelling_a_running_execution_asks_its_worker_and_answers_202(api: Api) -> None:
    job_id = await a_job(api)
    ident = await insert_execution(api, job_id, NOW, state="RUNNING", worker_id="w1", started_at=NOW)
    for _ in range(2):  # asking twice is harmless
        response = await api.client.post(f"/v1/executions/{ident}/cancel", headers=api.auth())
        assert response.status_code == 202, response.text
        assert response.json()["state"] == "RUNNING" and response.json()["cancelRequestedAt"]
    assert await api.redis.get(cancel_key(ident)) == b"1"
    assert await api.db.fetchval("SELECT cancel_requested_at IS NOT NULL FROM executions WHERE id = $1", ident)


async def test_an_execution_waiting_for_its_retry_is_cancelled_and_never_retried(api: Api) -> None:
    job_id = await a_job(api)
    ident = await insert_execution(
        api, job_id, NOW, state="FAILED", max_attempts=3, next_attempt_at=NOW + timedelta(seconds=30)
    )
    response = await api.client.post(f"/v1/executions/{ident}/cancel", headers=api.auth())
    assert response.status_code == 200 and response.json()["state"] == "CANCELLED"
    assert response.json()["nextAttemptAt"] is None


@pytest.mark.parametrize("finished", ["SUCCEEDED", "DEAD", "CANCELLED", "SKIPPED"])
async def test_a_finished_execution_cannot_be_cancelled(api: Api, finished: str) -> None:
    job_id = await a_job(api)
    ident = await insert_execution(api, job_id, NOW, state=finished)
    response = await api.client.post(f"/v1/executions/{ident}/cancel", headers=api.auth())
    assert response.status_code == 409, response.text
    assert finished in response.json()["detail"]
    assert await state_of(api, ident) == finished


async def test_another_tenants_execution_is_not_found_and_not_cancelled(api: Api) -> None:
    job_id = await a_job(api)
    ident = await insert_execution(api, job_id, NOW)
    paths = (f"/v1/executions/{ident}/cancel", f"/v1/executions/{ident}/retry", f"/v1/executions/{uuid.uuid4()}/cancel")
    for path in paths:
        response = await api.client.post(path, headers=api.auth("other"))
        assert response.status_code == 404, response.text
    assert await state_of(api, ident) == "PENDING"


# --- the dead letters and manual retry -------------------------------------------------------------


async def test_dead_executions_are_listed_newest_first_page_by_page(api: Api) -> None:
    job_id = await a_job(api)
    # Ids in order, of today (executions are partitioned by the day of their id).
    base = id_floor(datetime.now(UTC)).int
    dead = [
        await insert_execution(api, job_id, NOW + timedelta(seconds=i), state="DEAD", id=uuid.UUID(int=base + i))
        for i in range(5)
    ]
    await insert_execution(api, job_id, NOW + timedelta(minutes=1), state="SUCCEEDED")
    seen: list[str] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"state": "DEAD", "limit": 2, **({"cursor": cursor} if cursor else {})}
        response = await api.client.get("/v1/executions", params=params, headers=api.auth())
        assert response.status_code == 200, response.text
        page = ExecutionList.model_validate(response.json())
        assert all(item.state == "DEAD" for item in page.items)
        seen += [item.execution_id for item in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == [str(i) for i in reversed(dead)]
    other = await api.client.get("/v1/executions", params={"state": "DEAD"}, headers=api.auth("other"))
    assert other.json()["items"] == []


async def test_pending_and_running_executions_are_listed_apart_though_one_index_range_holds_both(api: Api) -> None:
    # executions_tenant_phase_idx has PENDING and RUNNING as one phase, OPEN (migration 0023).
    job_id = await a_job(api)
    base = id_floor(datetime.now(UTC)).int
    pending, running, done = [
        await insert_execution(api, job_id, NOW + timedelta(seconds=i), state=s, id=uuid.UUID(int=base + i))
        for i, s in enumerate(("PENDING", "RUNNING", "SUCCEEDED"))
    ]

    async def listed(*states: str) -> list[str]:
        params = {"state": list(states), "jobId": job_id}
        response = await api.client.get("/v1/executions", params=params, headers=api.auth())
        assert response.status_code == 200, response.text
        return [item.execution_id for item in ExecutionList.model_validate(response.json()).items]

    assert await listed("PENDING") == [str(pending)]
    assert await listed("RUNNING") == [str(running)]
    assert await listed("RUNNING", "PENDING", "SUCCEEDED") == [str(done), str(running), str(pending)]
    assert await listed() == [str(done), str(running), str(pending)]


async def test_the_execution_of_a_trace_is_found_by_its_trace_id_for_its_tenant_only(api: Api) -> None:
    job_id = await a_job(api)
    trace_id = uuid.uuid4().hex
    mine = await insert_execution(api, job_id, NOW, state="FAILED", trace_id=trace_id)
    await insert_execution(api, job_id, NOW + timedelta(seconds=1), state="FAILED", trace_id=uuid.uuid4().hex)

    response = await api.client.get("/v1/executions", params={"traceId": trace_id}, headers=api.auth())
    assert response.status_code == 200, response.text
    page = ExecutionList.model_validate(response.json())
    assert [(item.execution_id, item.trace_id) for item in page.items] == [(str(mine), trace_id)]
    both = {"traceId": trace_id, "state": "SUCCEEDED"}
    assert (await api.client.get("/v1/executions", params=both, headers=api.auth())).json()["items"] == []
    other = await api.client.get("/v1/executions", params={"traceId": trace_id}, headers=api.auth("other"))
    assert other.json()["items"] == []


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"state": "ZOMBIE"}, "state[0]"),  # `state` repeats: the first one is at fault
        ({"state": "DEAD", "cursor": "nope"}, "cursor"),
        ({"traceId": "not-a-trace"}, "traceId"),
        ({"traceId": "0" * 31}, "traceId"),
    ],
)
async def test_bad_list_parameters_are_named(api: Api, params: dict[str, str], field: str) -> None:
    response = await api.client.get("/v1/executions", params=params, headers=api.auth())
    assert response.status_code == 422
    assert error_fields(response) == [field]


async def test_a_dead_execution_is_retried_once_more_through_the_hot_window(api: Api) -> None:
    job_id = await a_job(api)
    ident = await insert_execution(api, job_id, NOW, state="DEAD", attempt=3, max_attempts=3, shard=2)
    response = await api.client.post(f"/v1/executions/{ident}/retry", headers=api.auth())
    assert response.status_code == 202, response.text
    view = response.json()
    assert response.headers["location"] == f"/v1/executions/{ident}"
    assert (view["state"], view["attempt"], view["maxAttempts"]) == ("DEAD", 3, 4)
    due = await api.db.fetchval("SELECT next_attempt_at FROM executions WHERE id = $1", ident)
    assert due is not None
    assert await api.redis.zscore("sundial:{2}:hot", retry_member(ident)) == to_ms(due)
    again = await api.client.post(f"/v1/executions/{ident}/retry", headers=api.auth())
    assert again.status_code == 202 and again.json()["maxAttempts"] == 4  # not one more again


@pytest.mark.parametrize("state", ["PENDING", "RUNNING", "SUCCEEDED", "CANCELLED"])
async def test_only_a_dead_execution_can_be_retried(api: Api, state: str) -> None:
    job_id = await a_job(api)
    ident = await insert_execution(api, job_id, NOW, state=state)
    response = await api.client.post(f"/v1/executions/{ident}/retry", headers=api.auth())
    assert response.status_code == 409, response.text
    assert await api.db.fetchval("SELECT next_attempt_at FROM executions WHERE id = $1", ident) is None


# --- Idempotency-Key -----------------------------------------------------------------------------------


async def create(api: Api, body: dict[str, Any], key: str, tenant: str = TENANT) -> httpx.Response:
    return await api.client.post("/v1/jobs", json=body, headers={**api.auth(tenant), "Idempotency-Key": key})


async def jobs_named(api: Api, name: str) -> int:
    return int(await api.db.fetchval("SELECT count(*) FROM jobs WHERE name = $1", name))


async def test_a_retried_create_with_the_same_key_answers_the_same_and_creates_nothing(api: Api) -> None:
    body = one_shot(name="idem")
    first = await create(api, body, "k-1")
    assert first.status_code == 201, first.text
    second = await create(api, body, "k-1")
    assert second.status_code == 201
    assert second.content == first.content
    assert second.headers["location"] == first.headers["location"] and second.headers["etag"] == first.headers["etag"]
    assert second.headers["idempotent-replayed"] == "true" and "idempotent-replayed" not in first.headers
    assert await jobs_named(api, "idem") == 1
    # Keys are per tenant: another tenant's same key is another request.
    other = await create(api, body, "k-1", tenant="other")
    assert other.status_code == 201 and other.json()["jobId"] != first.json()["jobId"]


async def test_the_same_key_with_another_body_is_refused(api: Api) -> None:
    assert (await create(api, one_shot(name="a"), "k-2")).status_code == 201
    response = await create(api, one_shot(name="b"), "k-2")
    assert response.status_code == 422
    assert error_fields(response) == ["Idempotency-Key"]
    assert await jobs_named(api, "b") == 0


async def test_the_same_key_while_the_first_request_runs_is_a_409(api: Api) -> None:
    from sundial_api.idempotency import request_hash
    from sundial_api.models.jobs import JobCreate

    body = one_shot(name="slow")
    # The first request holds the key (claimed, not completed yet).
    digest = request_hash(JobCreate.model_validate(body))
    assert await api.db.fetchval(
        "INSERT INTO idempotency_keys (tenant_id, key, request_hash, token, state, locked_until, expires_at)"
        " VALUES ($1, 'k-3', $2, $3, 'IN_FLIGHT', now() + interval '1 minute', now() + interval '1 day') RETURNING 1",
        TENANT,
        digest,
        uuid.uuid4(),
    )
    response = await create(api, body, "k-3")
    assert response.status_code == 409 and response.headers["retry-after"] == "1"
    assert await jobs_named(api, "slow") == 0
    # Its request died (the API crashed, Postgres restarted): once the lock has passed, a retry takes over.
    await api.db.execute("UPDATE idempotency_keys SET locked_until = now() - interval '1 second' WHERE key = 'k-3'")
    response = await create(api, body, "k-3")
    assert response.status_code == 201, response.text
    assert await jobs_named(api, "slow") == 1


async def test_concurrent_duplicate_creates_make_exactly_one_job(api: Api) -> None:
    body = one_shot(name="race")
    responses = await asyncio.gather(*(create(api, body, "k-4") for _ in range(20)))
    statuses = sorted(r.status_code for r in responses)
    assert set(statuses) <= {201, 409}, statuses
    assert await jobs_named(api, "race") == 1
    ids = {r.json()["jobId"] for r in responses if r.status_code == 201}
    assert len(ids) == 1


@pytest.mark.parametrize("key", ["", "x" * 256, "with space"])
async def test_a_malformed_key_is_named(api: Api, key: str) -> None:
    response = await create(api, one_shot(name="bad-key"), key)
    assert response.status_code == 422
    assert error_fields(response) == ["Idempotency-Key"]
    assert await jobs_named(api, "bad-key") == 0


async def test_a_retried_batch_with_the_same_key_registers_its_jobs_once(api: Api) -> None:
    items = [one_shot(name=f"batch-{i}") for i in range(3)] + [one_shot(target={"pool": "Bad Pool!", "handler": "x"})]
    headers = {**api.auth(), "Idempotency-Key": "batch-1"}
    first = await api.client.post("/v1/jobs:batch", json={"jobs": items}, headers=headers)
    assert first.status_code == 200 and first.json()["created"] == 3, first.text
    second = await api.client.post("/v1/jobs:batch", json={"jobs": items}, headers=headers)
    assert (second.status_code, second.content) == (200, first.content)
    assert second.headers["idempotent-replayed"] == "true"
    assert int(await api.db.fetchval("SELECT count(*) FROM jobs WHERE name LIKE 'batch-%'")) == 3
    other = await api.client.post("/v1/jobs:batch", json={"jobs": items[:1]}, headers=headers)
    assert other.status_code == 422 and error_fields(other) == ["Idempotency-Key"]


# --- priority ----------------------------------------------------------------------------------------


async def test_a_priority_patch_applies_to_next_fires_and_an_unknown_one_is_refused_naming_the_field(api: Api) -> None:
    job_id = await a_job(api)
    ident = await insert_execution(api, job_id, NOW)  # dispatched before the change (NORMAL, the default)
    refused = await api.client.patch(f"/v1/jobs/{job_id}", json={"priority": "URGENT"}, headers=api.auth())
    assert refused.status_code == 422 and error_fields(refused) == ["priority"], refused.text
    assert await api.db.fetchval("SELECT priority FROM jobs WHERE id = $1", uuid.UUID(job_id)) == "NORMAL"
    patched = await api.client.patch(f"/v1/jobs/{job_id}", json={"priority": "HIGH"}, headers=api.auth())
    assert patched.status_code == 200 and patched.json()["priority"] == "HIGH", patched.text
    view = await api.client.get(f"/v1/executions/{ident}", headers=api.auth())
    assert view.status_code == 200 and view.json()["priority"] == "NORMAL"  # what it was dispatched with
