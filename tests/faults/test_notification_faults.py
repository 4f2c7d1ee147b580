"""Notifications through kill -9: every incident recorded once, delivered at least once under one ``webhook-id``.

The whole stack runs (``FaultStack``, supervised: a killed process comes back) with a webhook receiver on
127.0.0.1 subscribed to ``execution.dead`` for the scenario's pool, and jobs whose handler always fails with
one attempt each, so every job makes one DEAD execution and the sweeper records one incident for it. While
they die:

* a second sweeper stands by, armed to die (``os._exit``) right after it records a batch of incidents and
  before it publishes their dead letters and marks them: whenever it takes over it dies in the one window
  where the next sweeper reads the same rows again;
* the supervised sweeper is SIGKILLed every few seconds until the armed one has taken over and died, so
  the standby keeps taking over mid-stream; the dispatcher is SIGKILLed once as well;
* the receiver answers the first requests ``503`` with ``Retry-After``, so some deliveries are retried.

Then Postgres and the receiver must agree: one incident per DEAD execution (no more, no fewer), one delivery
per incident, every delivery ``DELIVERED``, every request signed and carrying ``msg_<delivery id>``, and a
retried delivery's requests one and the same message.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from standardwebhooks import Webhook

from tests.faults.harness import FaultStack, budget, one_shots, scaled
from tests.support.ha import eventually
from tests.support.webhook_receiver import Reply, WebhookReceiver, running_receiver

JOBS = scaled(200)
CRASH_POINT = "sweeper.after_incidents"
pytestmark = [pytest.mark.faults, pytest.mark.timeout(int(budget(240)))]


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    async with running_receiver() as r:
        yield r


@pytest.fixture
async def faults(settings_env: dict[str, str], tmp_path: Path) -> AsyncIterator[FaultStack]:
    stack = FaultStack(
        settings_env, tmp_path, workers=1, extra_env={"SUNDIAL_DELIVERY_ALLOWED_NETWORKS": '["127.0.0.1/32"]'}
    )
    stack.start()
    try:
        await stack.ready()
        yield stack
    finally:
        await asyncio.to_thread(stack.stop)


async def test_sweepers_killed_while_recording_make_one_incident_each_delivered_under_one_id(
    faults: FaultStack, receiver: WebhookReceiver
) -> None:
    retry_later = Reply(503, headers={"Retry-After": "1"})
    receiver.script(retry_later, retry_later, retry_later, Reply(200))
    async with faults.client() as client:
        created = await client.post(
            "/v1/notifications/subscriptions",
            json={"url": receiver.url, "events": ["execution.dead"], "pool": faults.pool},
        )
    assert created.status_code == 201, created.text
    secret = created.json()["secret"]

    armed = faults.extra.start(
        "sweeper-armed", "sweeper", env={"SUNDIAL_CRASH_POINT": CRASH_POINT, "SUNDIAL_INSTANCE_ID": "sweeper-armed"}
    )
    bodies = one_shots(
        faults.pool,
        JOBS,
        start_in=4,
        spread=20,
        handler="storm",
        payload={"outageSec": 86_400},
        retry_policy={"maxAttempts": 1},
    )
    creating = asyncio.create_task(faults.create_jobs(bodies))

    async def some_dead() -> bool:
        rows = await faults.fetch("SELECT count(*) AS n FROM executions WHERE state = 'DEAD'")
        return int(rows[0]["n"]) > 0

    await eventually(some_dead, budget(60), "the first DEAD execution")
    faults.signal("dispatcher", signal.SIGKILL)
    kills = 0
    deadline = time.monotonic() + budget(90)
    while armed.poll() is None and time.monotonic() < deadline:
        try:
            faults.signal("sweeper", signal.SIGKILL)
            kills += 1
        except AssertionError:
            pass  # between its death and its restart
        await asyncio.sleep(3)
    assert armed.poll() is not None, f"the armed standby never took over in {kills} kills of the sweeper"
    assert f"crash point {CRASH_POINT} reached" in faults.log("sweeper-armed")

    job_ids = await creating
    await faults.wait_terminal(len(job_ids), within=120)

    async def all_delivered() -> bool:
        rows = await faults.fetch(
            "SELECT count(*) FILTER (WHERE state = 'DELIVERED') AS n FROM notification_deliveries"
        )
        return int(rows[0]["n"]) >= JOBS

    await eventually(all_delivered, budget(120), f"{JOBS} deliveries DELIVERED", interval=0.5)

    dead = {r["id"] for r in await faults.fetch("SELECT id FROM executions WHERE state = 'DEAD'")}
    assert len(dead) == JOBS
    incidents = await faults.fetch(
        "SELECT i.execution_id, count(*) AS n FROM notification_incidents i WHERE i.event = 'execution.dead'"
        " GROUP BY i.execution_id"
    )
    assert {r["execution_id"] for r in incidents} == dead, "one incident for every DEAD execution"
    assert max(int(r["n"]) for r in incidents) == 1, "an execution recorded as more than one incident"
    deliveries = await faults.fetch("SELECT id, state, attempts FROM notification_deliveries")
    assert len(deliveries) == JOBS and {d["state"] for d in deliveries} == {"DELIVERED"}

    by_id: dict[str, set[bytes]] = defaultdict(set)
    for got in receiver.received:
        event = Webhook(secret).verify(got.body, got.headers)
        assert event["type"] == "execution.dead"
        by_id[got.headers["webhook-id"]].add(got.body)
    assert set(by_id) == {f"msg_{d['id']}" for d in deliveries}, "every delivery reached the receiver"
    assert all(len(bodies) == 1 for bodies in by_id.values()), "a retried delivery is the same message"
    retried = sum(1 for d in deliveries if d["attempts"] > 1)
    assert retried >= 1
    print(
        f"\nfault notifications: {JOBS} DEAD executions, {len(incidents)} incidents, {len(deliveries)} deliveries; "
        f"{kills} sweeper kills, the armed standby died at {CRASH_POINT}, 1 dispatcher kill; "
        f"{len(receiver.received)} requests received ({retried} deliveries retried under their webhook-id)"
    )
