"""The audit trail users read: ``GET /v1/jobs/{id}/audit`` and ``GET /v1/executions/{id}/audit``.

In-process API on real Postgres (the ``api`` fixture of ``tests.support.api``): every mutation is in the trail with the
token's subject, the state before and after, in order; pages walk it whole; another tenant sees a 404.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import pytest
from sundial_api.models.audit import AuditPage
from sundial_client import AsyncClient, Client
from sundial_client.cli.executions import parser as executions_parser
from sundial_client.cli.jobs import parser as jobs_parser
from sundial_common.security.auth import issue_token
from sundial_common.stores import Stores
from sundial_common.stores.audit import ExecutionEvent, record_execution_event
from sundial_common.stores.executions import Outcome

from tests.integration.test_client import aclient, cli, client, served
from tests.support.api import NOW, SECRET, TENANT, Api, api, insert_execution, one_shot

__all__ = ["aclient", "api", "client", "served"]  # the fixtures

ALICE = {"Authorization": f"Bearer {issue_token(SECRET, TENANT, subject='alice@acme')}"}
BOB = {"Authorization": f"Bearer {issue_token(SECRET, TENANT, subject='bob@acme')}"}


@pytest.fixture
async def stores(api: Api) -> AsyncIterator[Stores]:
    stores = await Stores.connect(api.settings.database_url)
    try:
        yield stores
    finally:
        await stores.close()


async def test_who_cancelled_this_job_is_one_call_and_every_change_is_in_order(api: Api) -> None:
    created = await api.client.post("/v1/jobs", json=one_shot(), headers=ALICE)
    job_id = created.json()["jobId"]
    patched = await api.client.patch(
        f"/v1/jobs/{job_id}", json={"timeoutSec": 30, "payload": {"apiKey": "s3cret"}}, headers=BOB
    )
    assert patched.status_code == 200, patched.text
    for action in ("pause", "resume", "trigger"):
        assert (await api.client.post(f"/v1/jobs/{job_id}/{action}", headers=ALICE)).status_code < 300
    assert (await api.client.delete(f"/v1/jobs/{job_id}", headers=BOB)).status_code < 300

    who = await api.client.get(f"/v1/jobs/{job_id}/audit", params={"action": "cancel"}, headers=ALICE)
    assert who.status_code == 200, who.text
    (cancel,) = who.json()["items"]
    assert (cancel["actor"], cancel["fromState"], cancel["toState"]) == ("bob@acme", "ACTIVE", "CANCELLED")

    trail = AuditPage.model_validate((await api.client.get(f"/v1/jobs/{job_id}/audit", headers=ALICE)).json())
    assert [(e.action, e.actor) for e in trail.items] == [
        ("create", "alice@acme"),
        ("update", "bob@acme"),
        ("pause", "alice@acme"),
        ("resume", "alice@acme"),
        ("trigger", "alice@acme"),
        ("cancel", "bob@acme"),
    ]
    update = trail.items[1]
    assert update.detail == {
        "changed": ["payload", "timeoutSec"],
        "before": {"timeoutSec": 600},
        "after": {"timeoutSec": 30},
    }
    assert "s3cret" not in (await api.client.get(f"/v1/jobs/{job_id}/audit", headers=ALICE)).text
    assert [(e.from_state, e.to_state) for e in trail.items[2:4]] == [("ACTIVE", "PAUSED"), ("PAUSED", "ACTIVE")]
    assert trail.items[4].detail is not None and "executionId" in trail.items[4].detail
    assert all(a.at <= b.at for a, b in zip(trail.items, trail.items[1:], strict=False))
    assert trail.next_cursor is None


async def test_pages_walk_the_whole_trail_and_other_tenants_see_nothing(api: Api) -> None:
    job_id = (await api.create(one_shot())).json()["jobId"]
    for _ in range(3):
        await api.client.post(f"/v1/jobs/{job_id}/pause", headers=api.auth())
        await api.client.post(f"/v1/jobs/{job_id}/resume", headers=api.auth())
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = (await api.client.get(f"/v1/jobs/{job_id}/audit", params=params, headers=api.auth())).json()
        seen += [entry["action"] for entry in page["items"]]
        if not (cursor := page["nextCursor"]):
            break
    assert seen == ["create", *["pause", "resume"] * 3]

    other = await api.client.get(f"/v1/jobs/{job_id}/audit", headers=api.auth("globex"))
    assert other.status_code == 404
    assert (await api.client.get(f"/v1/jobs/{uuid.uuid4()}/audit", headers=api.auth())).status_code == 404
    assert (await api.client.get("/v1/jobs/not-a-uuid/audit", headers=api.auth())).status_code == 404
    bad = await api.client.get(f"/v1/jobs/{job_id}/audit", params={"cursor": "bm9wZQ"}, headers=api.auth())
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "cursor"
    # A filter that matches nothing on an existing job is an empty page, not a 404.
    empty = await api.client.get(f"/v1/jobs/{job_id}/audit", params={"action": "trigger"}, headers=api.auth())
    assert empty.status_code == 200 and empty.json() == {"items": [], "nextCursor": None}


async def test_an_executions_trail_has_its_transitions_its_cancel_and_recorded_events(api: Api, stores: Stores) -> None:
    job_id = (await api.create(one_shot())).json()["jobId"]
    ident = await insert_execution(api, job_id, NOW, max_attempts=3)
    assert await stores.executions.start_executions("worker-7", [(ident, 1)])
    await stores.executions.finish_executions(
        "worker-7", [Outcome(ident, 1, "FAILED", error="boom", retry_delay_ms=60_000)]
    )
    cancelled = await api.client.post(f"/v1/executions/{ident}/cancel", headers=ALICE)
    assert cancelled.status_code == 200, cancelled.text
    # What a worker refusing another tenant's message records (pools), batched or one at a time.
    assert await record_execution_event(stores.audit, ident, "refused", "worker-9", reason="tenant not served")
    assert await stores.audit.record_execution_events([ExecutionEvent(uuid.uuid4(), "refused", "worker-9")]) == 0

    response = await api.client.get(f"/v1/executions/{ident}/audit", headers=ALICE)
    assert response.status_code == 200, response.text
    trail = AuditPage.model_validate(response.json()).items
    assert [(e.action, e.from_state, e.to_state, e.actor) for e in trail] == [
        ("start", "PENDING", "RUNNING", "worker-7"),
        ("finish", "RUNNING", "FAILED", "worker-7"),
        ("cancel", "FAILED", "CANCELLED", "alice@acme"),
        ("refused", "CANCELLED", "CANCELLED", "worker-9"),
    ]
    assert trail[1].detail is not None and trail[1].detail["attempt"] == 1 and trail[1].detail["nextAttemptAt"]
    assert trail[3].detail == {"reason": "tenant not served"}
    other = await api.client.get(f"/v1/executions/{ident}/audit", headers=api.auth("globex"))
    assert other.status_code == 404


async def test_the_client_and_the_cli_show_who_cancelled_a_job(
    client: Client, aclient: AsyncClient, capsys: pytest.CaptureFixture[str]
) -> None:
    job = client.schedule(handler="echo", pool="demo", name="audited").after(seconds=600)
    client.jobs.pause(job.job_id)
    client.jobs.delete(job.job_id)

    (cancel,) = client.jobs.audit(job.job_id, actions=["cancel"])
    assert (cancel.actor, cancel.from_state, cancel.to_state) == (f"{TENANT}-service", "PAUSED", "CANCELLED")
    assert [e.action async for e in aclient.jobs.audit(job.job_id, page_size=1)] == ["create", "pause", "cancel"]

    code, out, _ = cli(jobs_parser(), ["audit", job.job_id, "--action", "cancel"], client, capsys)
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == ["AT", "ACTION", "FROM", "TO", "ACTOR", "DETAIL"]
    assert row.split()[1:5] == ["cancel", "PAUSED", "CANCELLED", f"{TENANT}-service"]
    code, out, _ = cli(jobs_parser(), ["audit", job.job_id, "--json"], client, capsys)
    assert code == 0 and [e["action"] for e in json.loads(out)] == ["create", "pause", "cancel"]
    code, _, err = cli(executions_parser(), ["audit", str(uuid.uuid4())], client, capsys)
    assert code == 3 and "not found" in err
