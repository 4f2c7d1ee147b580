"""Bulk operations on real Postgres: ``POST /v1/bulk-operations`` in process, and the runner
(:class:`~sundial_replayer.bulk.BulkRunner`) driven pass by pass.

Each test compares ids, not only counts: which rows were acted on, which were skipped and why, and that the rows of
another tenant, and rows created after the request, were never touched. Kill -9 of a real replayer mid-operation
is the fault test (``tests/faults/test_bulk_resume.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from datetime import timedelta
from typing import Any

import httpx
import pytest
import sundial_api.bulk_operations
from sundial_common.hotwindow.window import HotWindow, retry_member
from sundial_common.stores import Stores
from sundial_replayer.bulk import BulkConfig, BulkRunner

from tests.support.api import NOW, SECRET, TENANT, Api, api, error_fields, insert_execution, one_shot  # noqa: F401
from tests.support.tenants import tenant_token

FAST = BulkConfig(slice_sec=5.0, tenant_rate_per_sec=100_000)
_made = itertools.count()


async def a_job(api: Api, tenant: str = TENANT, **overrides: Any) -> str:  # noqa: F811
    response = await api.create(one_shot(**overrides), tenant=tenant)
    assert response.status_code == 201, response.text
    return str(response.json()["jobId"])


async def dead(api: Api, job_id: str, n: int, *, tenant: str = TENANT, pool: str = "demo") -> list[uuid.UUID]:  # noqa: F811
    """``n`` DEAD executions of ``job_id`` (3 of 3 attempts used), finished a minute ago."""
    return [
        await insert_execution(
            api,
            job_id,
            NOW - timedelta(minutes=10, seconds=next(_made)),
            tenant_id=tenant,
            pool=pool,
            state="DEAD",
            attempt=3,
            max_attempts=3,
            finished_at=NOW - timedelta(minutes=1),
        )
        for _ in range(n)
    ]


async def bulk(api: Api, body: dict[str, Any], tenant: str = TENANT, **headers: str) -> httpx.Response:  # noqa: F811
    return await api.client.post("/v1/bulk-operations", json=body, headers={**api.auth(tenant), **headers})


async def run_to_end(
    stores: Stores, op_id: str, config: BulkConfig = FAST, hot_window: HotWindow | None = None
) -> dict[str, Any]:
    runner = BulkRunner(stores.bulk, config, hot_window)
    async with asyncio.timeout(30):
        while True:
            await runner.run_once()
            row = await stores.bulk.get(uuid.UUID(op_id), None)
            assert row is not None
            if row["state"] not in ("PREPARING", "RUNNING"):
                return dict(row)


async def test_bad_requests_name_the_field_and_create_nothing(api: Api) -> None:  # noqa: F811
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"target": "executions", "action": "redrive", "filter": {}}, 422, "filter"),
        ({"target": "executions", "action": "redrive", "filter": {"pool": None}}, 422, "filter"),
        (
            {"target": "executions", "action": "redrive", "filter": {"pool": "demo", "color": "red"}},
            422,
            "filter.color",
        ),
        ({"target": "executions", "action": "redrive", "filter": {"pool": "demo"}, "speed": 3}, 422, "speed"),
        ({"target": "executions", "action": "pause", "filter": {"pool": "demo"}}, 422, "action"),
        ({"target": "rows", "action": "cancel", "filter": {"pool": "demo"}}, 422, "target"),
        ({"target": "executions", "action": "redrive", "filter": {"state": "ASLEEP"}}, 422, "filter.state"),
        (
            {
                "target": "executions",
                "action": "redrive",
                "filter": {"finishedFrom": "2026-05-05T10:00:00Z", "finishedTo": "2026-05-05T09:00:00Z"},
            },
            422,
            "filter.finishedTo",
        ),
        (
            {"target": "jobs", "action": "pause", "filter": {"finishedFrom": "2026-05-05T10:00:00Z"}},
            422,
            "filter.finishedFrom",
        ),
        ({"target": "jobs", "action": "pause", "filter": {"pool": "demo"}, "ratePerSec": 0}, 422, "ratePerSec"),
        ({"target": "jobs", "action": "pause", "filter": {"pool": "demo"}, "tenantId": "other"}, 403, "tenantId"),
    ]
    for body, status, field in cases:
        response = await bulk(api, body)
        assert response.status_code == status, (body, response.text)
        assert field in error_fields(response), (body, response.text)
    assert await api.db.fetchval("SELECT count(*) FROM bulk_operations") == 0


async def test_a_selection_beyond_the_limit_is_refused_at_create_naming_the_limit(
    api: Api,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The limit is 1,000,000 rows; a limit of 3 shows the same refusal on 4 rows.
    monkeypatch.setattr(sundial_api.bulk_operations, "MAX_SELECTED", 3)
    job = await a_job(api)
    await dead(api, job, 4)
    body = {"target": "executions", "action": "redrive", "filter": {"state": "DEAD"}}
    refused = await bulk(api, body)
    assert refused.status_code == 422, refused.text
    assert error_fields(refused) == ["filter"] and "selects more than 3 rows" in refused.text
    assert await api.db.fetchval("SELECT count(*) FROM bulk_operations") == 0  # not accepted, then FAILED
    monkeypatch.setattr(sundial_api.bulk_operations, "MAX_SELECTED", 4)
    accepted = await bulk(api, body)
    assert accepted.status_code == 202, accepted.text


async def test_a_redrive_acts_on_the_fixed_selection_once_and_audits_each_row(api: Api, stores: Stores) -> None:  # noqa: F811
    job = await a_job(api)
    selected = await dead(api, job, 30)
    other_pool = await dead(api, job, 3, pool="reports")
    other_job = await a_job(api, tenant="other")
    theirs = await dead(api, other_job, 5, tenant="other")
    body = {"target": "executions", "action": "redrive", "filter": {"state": "DEAD", "pool": "demo"}}

    dry = await bulk(api, {**body, "dryRun": True})
    assert dry.status_code == 200, dry.text
    assert dry.json()["count"] == 30
    assert [s["id"] for s in dry.json()["sample"]] == [str(i) for i in sorted(selected)[:20]]
    assert await api.db.fetchval("SELECT count(*) FROM bulk_operations") == 0

    created = await bulk(api, body)
    assert created.status_code == 202, created.text
    assert created.json()["state"] == "PREPARING" and created.json()["total"] is None
    location = created.headers["location"]
    # Created after the request: never selected, however late the selection is fixed.
    later = await dead(api, job, 2)

    final = await run_to_end(stores, created.json()["operationId"], hot_window=HotWindow(api.redis))
    assert (final["state"], final["total"], final["done"], final["skipped"], final["failed"]) == (
        "SUCCEEDED",
        dry.json()["count"],
        30,
        0,
        0,
    )
    rows = await api.db.fetch(
        "SELECT id, next_attempt_at IS NOT NULL AS due, max_attempts FROM executions WHERE state = 'DEAD'"
    )
    due = {r["id"] for r in rows if r["due"]}
    assert due == set(selected)
    assert all(r["max_attempts"] == 4 for r in rows if r["due"])
    assert not due & set(other_pool + theirs + later)
    # Due now, so announced to the shard leaders at once, as the single-row retry does.
    announced = await api.redis.zrange("sundial:{0}:hot", 0, -1)
    members = {m.decode() if isinstance(m, bytes) else str(m) for m in announced}
    assert {m for m in members if m.startswith("r:")} == {retry_member(i) for i in selected}  # (and the job's own)
    audit = await api.db.fetch(
        "SELECT entity_id, actor FROM audit_log WHERE action = 'retry_request' ORDER BY entity_id"
    )
    assert sorted(r["entity_id"] for r in audit) == sorted(selected)  # one entry per row, none twice
    assert all(created.json()["operationId"] in r["actor"] for r in audit)

    view = (await api.client.get(location, headers=api.auth())).json()
    assert (view["state"], view["total"], view["done"], view["eta"]) == ("SUCCEEDED", 30, 30, view["finishedAt"])
    page = (await api.client.get(f"{location}/items?limit=25", headers=api.auth())).json()
    assert [i["outcome"] for i in page["items"]] == ["DONE"] * 25 and page["nextCursor"]
    rest = (await api.client.get(f"{location}/items?cursor={page['nextCursor']}", headers=api.auth())).json()
    assert [i["id"] for i in page["items"] + rest["items"]] == [str(i) for i in sorted(selected)]

    # The same filter again: what it re-drove has its retry scheduled; only the rows made since are selected.
    again = await bulk(api, {**body, "dryRun": True})
    assert [s["id"] for s in again.json()["sample"]] == [str(i) for i in sorted(later)]


async def test_rows_that_changed_are_skipped_with_the_reason_and_a_cancel_stops_it(
    api: Api,  # noqa: F811
    stores: Stores,
) -> None:
    job = await a_job(api)
    selected = sorted(await dead(api, job, 12))
    created = await bulk(
        api, {"target": "executions", "action": "redrive", "filter": {"jobIds": [job]}, "ratePerSec": 2}
    )
    op_id = uuid.UUID(created.json()["operationId"])
    assert (await stores.bulk.prepare(op_id))["total"] == 12  # type: ignore[index]
    # Someone re-drives the first one by hand meanwhile: the operation skips it, saying why.
    await api.db.execute("UPDATE executions SET state = 'SUCCEEDED' WHERE id = $1", selected[0])
    first = await stores.bulk.act(op_id, 4)
    assert first.outcomes == {"SKIPPED": 1, "DONE": 3}
    items = (await api.client.get(f"/v1/bulk-operations/{op_id}/items?outcome=SKIPPED", headers=api.auth())).json()
    assert [(i["id"], i["reason"]) for i in items["items"]] == [
        (str(selected[0]), "is SUCCEEDED now: nothing to redrive")
    ]

    cancelled = await api.client.post(f"/v1/bulk-operations/{op_id}/cancel", headers=api.auth())
    assert cancelled.status_code == 202, cancelled.text
    after = await stores.bulk.act(op_id, 4)
    assert after.operation is not None and after.operation["state"] == "CANCELLED" and after.outcomes == {}
    untouched = await api.db.fetchval(
        "SELECT count(*) FROM executions WHERE id = ANY($1) AND next_attempt_at IS NULL AND state = 'DEAD'",
        selected[4:],
    )
    assert untouched == 8
    again = await api.client.post(f"/v1/bulk-operations/{op_id}/cancel", headers=api.auth())
    assert again.status_code == 409


async def test_job_actions_pause_resume_trigger_and_cancel_by_label(api: Api, stores: Stores) -> None:  # noqa: F811
    nightly = [await a_job(api, name=f"nightly-{i}", labels={"team": "billing"}) for i in range(4)]
    keep = await a_job(api, name="nightly-other", labels={"team": "search"})
    parent = nightly[0]
    child = await api.create(
        {
            "name": "after-nightly",
            "type": "DEPENDENT",
            "dependsOn": [{"jobId": parent, "on": "SUCCEEDED"}],
            "target": {"pool": "demo", "handler": "echo"},
        }
    )
    assert child.status_code == 201, child.text

    async def act(action: str) -> dict[str, Any]:
        body = {"target": "jobs", "action": action, "filter": {"labels": {"team": "billing"}, "namePrefix": "nightly-"}}
        created = await bulk(api, body)
        assert created.status_code == 202, created.text
        return await run_to_end(stores, created.json()["operationId"])

    assert (await act("pause"))["done"] == 4
    states = dict(await api.db.fetch("SELECT id::text, state FROM jobs WHERE name LIKE 'nightly-%'"))
    assert {states[j] for j in nightly} == {"PAUSED"} and states[keep] == "ACTIVE"
    assert (await act("resume"))["done"] == 4
    assert (await act("trigger"))["done"] == 4
    assert await api.db.fetchval("SELECT count(*) FROM jobs WHERE trigger_at IS NOT NULL") == 4
    cancel = await act("cancel")
    # The parent of a DEPENDENT job is skipped, saying why; the others are cancelled as DELETE /v1/jobs/{id} does.
    assert (cancel["done"], cancel["skipped"]) == (3, 1)
    items = (
        await api.client.get(f"/v1/bulk-operations/{cancel['id']}/items?outcome=SKIPPED", headers=api.auth())
    ).json()
    assert items["items"][0]["id"] == parent and "DEPENDENT" in items["items"][0]["reason"]
    states = dict(await api.db.fetch("SELECT id::text, state FROM jobs WHERE name LIKE 'nightly-%'"))
    assert [states[j] for j in nightly] == ["ACTIVE", "CANCELLED", "CANCELLED", "CANCELLED"]


async def test_idempotency_key_and_tenant_isolation(api: Api, stores: Stores) -> None:  # noqa: F811
    job = await a_job(api)
    mine = await dead(api, job, 3)
    other_job = await a_job(api, tenant="other")
    theirs = await dead(api, other_job, 4, tenant="other")
    body = {"target": "executions", "action": "redrive", "filter": {"state": ["DEAD"]}}

    first = await bulk(api, body, **{"Idempotency-Key": "after-outage-1"})
    again = await bulk(api, body, **{"Idempotency-Key": "after-outage-1"})
    assert first.status_code == again.status_code == 202
    assert again.json()["operationId"] == first.json()["operationId"] and again.headers["idempotent-replayed"] == "true"
    changed = await bulk(api, {**body, "ratePerSec": 7}, **{"Idempotency-Key": "after-outage-1"})
    assert changed.status_code == 422 and error_fields(changed) == ["Idempotency-Key"]

    location = first.headers["location"]
    assert (await api.client.get(location, headers=api.auth("other"))).status_code == 404
    assert (await api.client.get(f"{location}/items", headers=api.auth("other"))).status_code == 404
    assert (await api.client.post(f"{location}/cancel", headers=api.auth("other"))).status_code == 404
    assert (await api.client.get("/v1/bulk-operations", headers=api.auth("other"))).json()["items"] == []
    await run_to_end(stores, first.json()["operationId"])
    due = set(await api.db.fetch("SELECT id FROM executions WHERE next_attempt_at IS NOT NULL"))
    assert {r["id"] for r in due} == set(mine)

    # An admin acts on one named tenant's rows: only that tenant's.
    admin = {"Authorization": f"Bearer {tenant_token(api.settings.database_url, 'ops', admin=True, secret=SECRET)}"}
    by_admin = await api.client.post("/v1/bulk-operations", json={**body, "tenantId": "other"}, headers=admin)
    assert by_admin.status_code == 202, by_admin.text
    assert by_admin.json()["tenantId"] == "other"
    await run_to_end(stores, by_admin.json()["operationId"])
    due = set(await api.db.fetch("SELECT id FROM executions WHERE next_attempt_at IS NOT NULL"))
    assert {r["id"] for r in due} == set(mine + theirs)
    listed = (await api.client.get("/v1/bulk-operations", headers=admin)).json()["items"]
    assert {o["tenantId"] for o in listed} == {TENANT, "other"}


async def test_a_new_runner_resumes_after_the_last_committed_batch(api: Api, stores: Stores) -> None:  # noqa: F811
    job = await a_job(api)
    selected = await dead(api, job, 10)
    created = await bulk(api, {"target": "executions", "action": "cancel", "filter": {"jobIds": [job]}})
    assert created.status_code == 202
    # A cancel selects what can be cancelled: none of these DEAD rows.
    assert (await run_to_end(stores, created.json()["operationId"]))["total"] == 0

    created = await bulk(
        api, {"target": "executions", "action": "redrive", "filter": {"jobIds": [job]}, "ratePerSec": 30}
    )
    op_id = uuid.UUID(created.json()["operationId"])
    first = BulkRunner(stores.bulk, BulkConfig(slice_sec=0.05))
    await first.run_once()  # prepares it and acts on the first batch (3 rows at 30/s), then its slice is over
    row = await stores.bulk.get(op_id, None)
    assert row is not None and 0 < row["cursor_seq"] < 10
    final = await run_to_end(stores, str(op_id))  # another runner (a new leader) takes over
    assert (final["done"], final["resumes"]) == (10, 1)
    audits = await api.db.fetchval(
        "SELECT count(*) FROM audit_log WHERE action = 'retry_request' AND entity_id = ANY($1)", selected
    )
    assert audits == 10


async def test_finished_operations_are_purged_after_the_retention(api: Api, stores: Stores) -> None:  # noqa: F811
    job = await a_job(api)
    await dead(api, job, 2)
    created = await bulk(api, {"target": "executions", "action": "redrive", "filter": {"jobIds": [job]}})
    op_id = created.json()["operationId"]
    await run_to_end(stores, op_id)
    await api.db.execute("UPDATE bulk_operations SET finished_at = now() - interval '31 days'")
    assert await BulkRunner(stores.bulk).run_once() is not None
    assert await api.db.fetchval("SELECT count(*) FROM bulk_operations") == 0
    assert await api.db.fetchval("SELECT count(*) FROM bulk_operation_items") == 0


async def test_a_trigger_is_refused_for_a_job_whose_pool_no_longer_admits_its_tenant(
    api: Api,  # noqa: F811
    stores: Stores,
) -> None:
    job = await a_job(api, name="moved-away", target={"pool": "reports", "handler": "echo"})
    stays = await a_job(api, name="stays")  # same batch, a pool still open to the tenant
    before = await api.db.fetchrow("SELECT owner, shared_with FROM pools WHERE name = 'reports'")
    await api.db.execute("UPDATE pools SET owner = NULL, shared_with = ARRAY['another-tenant'] WHERE name = 'reports'")
    try:
        body = {"target": "jobs", "action": "trigger", "filter": {"jobIds": [job, stays]}}
        created = await bulk(api, body)
        assert created.status_code == 202, created.text
        finished = await run_to_end(stores, created.json()["operationId"])
    finally:
        restore = "UPDATE pools SET owner = $1, shared_with = $2 WHERE name = 'reports'"
        await api.db.execute(restore, before["owner"], before["shared_with"])
    # As a single trigger would answer 403: no new work goes to a pool the tenant may no longer use.
    assert (finished["done"], finished["failed"]) == (1, 1)
    items = (await api.client.get(f"/v1/bulk-operations/{finished['id']}/items", headers=api.auth())).json()
    reasons = {item["id"]: (item["outcome"], item["reason"]) for item in items["items"]}
    assert reasons[job][0] == "FAILED" and "pool `reports` is not open to tenant" in reasons[job][1]
    assert reasons[stays][0] == "DONE"
    assert await api.db.fetchval("SELECT trigger_at FROM jobs WHERE id = $1", uuid.UUID(job)) is None
    assert await api.db.fetchval("SELECT trigger_at FROM jobs WHERE id = $1", uuid.UUID(stays)) is not None
