"""Jobs that run after other jobs, on real Postgres, Redis and the broker: the graph over HTTP (in-process API),
the trigger rows every final-state write records, and the shard leader turning them into executions.

The parent's executions are moved along with the real store calls the worker, the sweeper and the API
use (start, finish, lost attempt, cancel), so each path that can end an execution is shown to record its
trigger in the same statement; the leader pass is :class:`sundial_dispatcher.triggers.TriggerDispatcher`.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from sundial_common.broker.kafka import KafkaPublisher
from sundial_common.domain.ids import new_id
from sundial_common.hotwindow.rate_limits import TokenBuckets
from sundial_common.stores import Stores
from sundial_common.stores.dispatch import FencedOut
from sundial_common.stores.executions import LostAttempt, Outcome
from sundial_dispatcher.fairness import FairnessConfig, OpenWork
from sundial_dispatcher.limits import SideLimits
from sundial_dispatcher.tenancy import TenantPolicy
from sundial_dispatcher.triggers import TriggerConfig, TriggerDispatcher

from tests.support.api import NOW, TENANT, Api, api, delayed, error_fields  # noqa: F401  (the `api` fixture)
from tests.support.tenants import register_tenant


def dependent(parents: list[str], on: str = "SUCCEEDED", **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "after",
        "type": "DEPENDENT",
        "dependsOn": [{"jobId": p, "on": on} for p in parents],
        "target": {"pool": "demo", "handler": "echo"},
    }
    body.update(overrides)
    return body


async def make(api: Api, body: dict[str, Any], tenant: str = TENANT) -> str:  # noqa: F811
    response = await api.create(body, tenant=tenant)
    assert response.status_code == 201, response.text
    return str(response.json()["jobId"])


async def run_parent(
    api: Api,  # noqa: F811
    stores: Stores,
    job_id: str,
    outcomes: list[str],
    *,
    n: int = 0,
    tenant: str = TENANT,
) -> list[uuid.UUID]:
    """Executions of ``job_id`` (one per outcome) started and finished by a worker in one batch each."""
    ids = []
    for i, _ in enumerate(outcomes):
        execution_id = new_id()
        await api.db.execute(
            "INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler, state,"
            " timeout_sec, traceparent) VALUES ($1, $2, $3, $4, 0, 1, 'demo', 'echo', 'PENDING', 60, $5)",
            execution_id,
            tenant,
            uuid.UUID(job_id),
            NOW + timedelta(seconds=n * 100 + i),
            f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01",
        )
        ids.append(execution_id)
    await stores.executions.start_executions("w1", [(i, 1) for i in ids])
    finished = await stores.executions.finish_attempts(
        "w1", [Outcome(i, 1, state) for i, state in zip(ids, outcomes, strict=True)]
    )
    assert len(finished) == len(ids)
    return ids


def side_limits(api: Api, stores: Stores, **fairness: Any) -> SideLimits:  # noqa: F811
    """Fair dispatch's limits as a dispatcher process applies them, with the counts and the registry read afresh
    every pass (the tests change them between passes). A fixed pool cap, as in test_fair_dispatch.py."""
    fairness.setdefault("pool_queue_min", fairness.get("pool_queue_cap", FairnessConfig.pool_queue_cap))
    config = FairnessConfig(counts_refresh_sec=0, **fairness)
    policy = TenantPolicy(stores.tenants, refresh_sec=0)
    return SideLimits(policy, OpenWork(stores.tenants, config), TokenBuckets(api.redis), shards=1, batch_size=1000)


def leader(
    stores: Stores,
    publisher: KafkaPublisher,
    token: int,
    shard: int,
    limits: SideLimits | None = None,
    config: TriggerConfig | None = None,
) -> TriggerDispatcher:
    return TriggerDispatcher(
        shard,
        token,
        f"leader-{token}",
        stores.dependencies,
        stores.dispatch,
        publisher,
        config or TriggerConfig(),
        limits=limits,
    )


async def fire_all(
    stores: Stores,
    publisher: KafkaPublisher,
    passes: int = 1,
    limits: SideLimits | None = None,
    config: TriggerConfig | None = None,
) -> int:
    """A new term on every shard (the API runs 4), and ``passes`` leader passes in it."""
    fired = 0
    for shard in range(4):
        token = await stores.dispatch.take_shard(shard, "test")
        for _ in range(passes):
            fired += (await leader(stores, publisher, token, shard, limits, config).run_once()).fired
    return fired


async def children_executions(db: asyncpg.Connection, job_id: str) -> list[asyncpg.Record]:
    return list(await db.fetch("SELECT * FROM executions WHERE job_id = $1 ORDER BY scheduled_for", uuid.UUID(job_id)))


# --- the graph over HTTP ----------------------------------------------------------------------------


async def test_a_chain_is_created_and_each_job_shows_its_parents_and_children(api: Api) -> None:  # noqa: F811
    a = await make(api, delayed())
    b = await make(api, dependent([a]))
    c = await make(api, dependent([b], on="ANY", catchupPolicy="SKIP"))

    job_b = (await api.client.get(f"/v1/jobs/{b}", headers=api.auth())).json()
    assert job_b["type"] == "DEPENDENT" and job_b["state"] == "ACTIVE" and job_b["nextFireAt"] is None
    assert [(p["jobId"], p["on"], p["waiting"]) for p in job_b["parents"]] == [(a, "SUCCEEDED", 0)]
    assert [(ch["jobId"], ch["on"]) for ch in job_b["children"]] == [(c, "ANY")]
    job_a = (await api.client.get(f"/v1/jobs/{a}", headers=api.auth())).json()
    assert job_a["parents"] == [] and [ch["jobId"] for ch in job_a["children"]] == [b]
    assert (await api.client.get(f"/v1/jobs/{c}", headers=api.auth())).json()["catchupPolicy"] == "SKIP"


async def test_bad_graphs_are_refused_naming_the_field_and_nothing_is_written(api: Api) -> None:  # noqa: F811
    a = await make(api, delayed())
    b = await make(api, dependent([a]))
    c = await make(api, dependent([b]))
    theirs = (await api.create(delayed(), tenant="globex")).json()["jobId"]
    before = await api.counts()
    edges = await api.db.fetchval("SELECT count(*) FROM job_dependencies")

    unknown = await api.create(dependent([str(uuid.uuid4())]))
    assert unknown.status_code == 404 and error_fields(unknown) == ["dependsOn[0].jobId"]
    foreign = await api.create(dependent([theirs]))
    assert foreign.status_code == 404 and error_fields(foreign) == ["dependsOn[0].jobId"]
    for body, field in [
        ({**delayed(), "dependsOn": [{"jobId": a}]}, "dependsOn"),  # a clock and parents: refused
        ({**dependent([a]), "dependsOn": None}, "dependsOn"),
        (dependent([a, a]), "dependsOn"),
        (dependent([a], on="MAYBE"), "dependsOn[0].on"),
        (dependent([a], overlapPolicy="SKIP"), "overlapPolicy"),
    ]:
        response = await api.create(body)
        assert response.status_code == 422, response.text
        assert error_fields(response) == [field], response.text
    many = [await make(api, delayed()) for _ in range(11)]
    before = await api.counts()
    too_many = await api.create(dependent(many))
    assert too_many.status_code == 422 and error_fields(too_many) == ["dependsOn"]

    # A → B → C; making A run after C closes the cycle: 422 naming it, nothing changed.
    cycle = await api.client.patch(f"/v1/jobs/{b}", json={"dependsOn": [{"jobId": c}]}, headers=api.auth())
    assert cycle.status_code == 422 and error_fields(cycle) == ["dependsOn"]
    assert b in cycle.json()["detail"] and c in cycle.json()["detail"] and "cycle" in cycle.json()["detail"]
    itself = await api.client.patch(f"/v1/jobs/{b}", json={"dependsOn": [{"jobId": b}]}, headers=api.auth())
    assert itself.status_code == 422 and "cycle" in itself.json()["detail"]
    to_clock = await api.client.patch(f"/v1/jobs/{b}", json={"type": "DELAYED", "delaySeconds": 5}, headers=api.auth())
    assert to_clock.status_code == 422 and error_fields(to_clock) == ["type"]
    assert await api.counts() == before
    assert await api.db.fetchval("SELECT count(*) FROM job_dependencies") == edges
    parents_of_b = await api.db.fetch(
        "SELECT parent_job_id FROM job_dependencies WHERE child_job_id = $1", uuid.UUID(b)
    )
    assert [str(r["parent_job_id"]) for r in parents_of_b] == [a]

    # A valid change of parents is accepted and shown.
    moved = await api.client.patch(f"/v1/jobs/{c}", json={"dependsOn": [{"jobId": a, "on": "ANY"}]}, headers=api.auth())
    assert moved.status_code == 200, moved.text
    shown = (await api.client.get(f"/v1/jobs/{c}", headers=api.auth())).json()["parents"]
    assert [(p["jobId"], p["on"]) for p in shown] == [(a, "ANY")]


async def test_deleting_a_parent_with_live_children_is_refused_unless_cascaded(api: Api) -> None:  # noqa: F811
    a = await make(api, delayed())
    b = await make(api, dependent([a]))
    c = await make(api, dependent([b]))

    refused = await api.client.delete(f"/v1/jobs/{a}", headers=api.auth())
    assert refused.status_code == 409
    assert b in refused.json()["detail"] and c in refused.json()["detail"]
    states = {r["id"]: r["state"] for r in await api.db.fetch("SELECT id, state FROM jobs")}
    assert set(states.values()) == {"ACTIVE"}

    cascaded = await api.client.delete(f"/v1/jobs/{a}", params={"cascade": "true"}, headers=api.auth())
    assert cascaded.status_code == 200, cascaded.text
    states = {str(r["id"]): r["state"] for r in await api.db.fetch("SELECT id, state FROM jobs")}
    assert states == {a: "CANCELLED", b: "CANCELLED", c: "CANCELLED"}
    # A leaf has no children: deleted as before.
    leaf = await make(api, delayed())
    assert (await api.client.delete(f"/v1/jobs/{leaf}", headers=api.auth())).status_code == 200


# --- triggers and the leader ---------------------------------------------------------------------------


async def test_each_qualifying_parent_execution_fires_the_child_exactly_once(
    api: Api,  # noqa: F811
    stores: Stores,
    publisher: KafkaPublisher,
) -> None:
    a = await make(api, delayed())
    on_success = await make(api, dependent([a]))
    on_failure = await make(api, dependent([a], on="FAILED"))
    on_any = await make(api, dependent([a], on="ANY"))

    # Two parent executions end in one worker batch: one statement, one now() — the same instant.
    parents = await run_parent(api, stores, a, ["SUCCEEDED", "SUCCEEDED"])
    # The completion reported again (a worker retrying its write): the CAS accepts nothing more.
    again = await stores.executions.finish_attempts("w1", [Outcome(p, 1, "SUCCEEDED") for p in parents])
    assert again == []
    assert await fire_all(stores, publisher, passes=2) == 4
    # The next term (a failed-over leader): nothing more.
    assert await fire_all(stores, publisher) == 0

    rows = await children_executions(api.db, on_success)
    assert len(rows) == 2  # same instant, two triggers: never collapsed into one
    assert sorted(r["caused_by"][0] for r in rows) == sorted(parents)
    assert rows[0]["scheduled_for"] < rows[1]["scheduled_for"]
    assert len(await children_executions(api.db, on_any)) == 2
    assert await children_executions(api.db, on_failure) == []

    # The uniqueness is Postgres': a second execution of the same (child, trigger) cannot be inserted.
    with pytest.raises(asyncpg.UniqueViolationError):
        await api.db.execute(
            "INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler, state,"
            " timeout_sec, trigger_id) VALUES ($1, $2, $3, now(), 0, 9, 'demo', 'echo', 'PENDING', 60, $4)",
            new_id(),
            TENANT,
            uuid.UUID(on_success),
            rows[0]["trigger_id"],
        )
    view = (await api.client.get(f"/v1/executions/{rows[0]['id']}", headers=api.auth())).json()
    assert view["causedBy"] == [str(rows[0]["caused_by"][0])] and view["state"] == "PENDING"


async def test_a_stale_leader_cannot_fire_triggers(api: Api, stores: Stores, publisher: KafkaPublisher) -> None:  # noqa: F811
    a = await make(api, delayed())
    b = await make(api, dependent([a]))
    shard = await api.db.fetchval("SELECT shard FROM jobs WHERE id = $1", uuid.UUID(b))
    old = await stores.dispatch.take_shard(shard, "old")
    await stores.dispatch.take_shard(shard, "new")
    await run_parent(api, stores, a, ["SUCCEEDED"])
    with pytest.raises(FencedOut):
        await leader(stores, publisher, old, shard).run_once()
    assert await children_executions(api.db, b) == []


async def test_every_final_state_path_records_its_trigger(api: Api, stores: Stores, publisher: KafkaPublisher) -> None:  # noqa: F811
    """The worker's DEAD, the sweeper's lost attempt, and a cancel by the API all trigger an ANY child."""
    a = await make(api, delayed())
    child = await make(api, dependent([a], on="ANY"))
    failed_child = await make(api, dependent([a], on="FAILED"))
    dead = await run_parent(api, stores, a, ["FAILED"])  # max_attempts 1: DEAD
    lost = new_id()
    cancelled = new_id()
    for i, execution_id in enumerate((lost, cancelled)):
        await api.db.execute(
            "INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler, state,"
            " timeout_sec) VALUES ($1, $2, $3, $4, 0, 1, 'demo', 'echo', 'PENDING', 60)",
            execution_id,
            TENANT,
            uuid.UUID(a),
            NOW + timedelta(hours=1, seconds=i),
        )
    await stores.executions.start_executions("w2", [(lost, 1)])
    swept = await stores.executions.fail_running(
        "sweeper", [LostAttempt(lost, 1, "w2", "FAILED_WORKER_LOST", "worker lost", 0)]
    )
    assert [f.state for f in swept] == ["DEAD"]
    assert (await stores.executions.cancel_execution(TENANT, cancelled, "someone")) is not None

    assert await fire_all(stores, publisher) == 5
    assert sorted(r["caused_by"][0] for r in await children_executions(api.db, child)) == sorted(
        [dead[0], lost, cancelled]
    )
    assert sorted(r["caused_by"][0] for r in await children_executions(api.db, failed_child)) == sorted([dead[0], lost])


async def test_fan_in_fires_once_every_parent_has_a_new_execution(
    api: Api,  # noqa: F811
    stores: Stores,
    publisher: KafkaPublisher,
    spans: Any,
) -> None:
    a = await make(api, delayed())
    b = await make(api, delayed())
    both = await make(api, dependent([a, b]))

    first_a = await run_parent(api, stores, a, ["SUCCEEDED", "SUCCEEDED"])  # A runs twice before B runs once
    assert await fire_all(stores, publisher) == 0
    waiting = (await api.client.get(f"/v1/jobs/{both}", headers=api.auth())).json()["parents"]
    assert {p["jobId"]: p["waiting"] for p in waiting} == {a: 2, b: 0}
    first_b = await run_parent(api, stores, b, ["SUCCEEDED"])
    assert await fire_all(stores, publisher) == 1
    [run] = await children_executions(api.db, both)
    assert sorted(run["caused_by"]) == sorted(first_a + first_b)

    # The child's trace is its own, linked to each parent execution's trace.
    [span] = [s for s in spans.get_finished_spans() if s.attributes.get("sundial.execution_id") == str(run["id"])]
    parent_traces = {
        int(r["traceparent"].split("-")[1], 16)
        for r in await api.db.fetch("SELECT traceparent FROM executions WHERE id = ANY($1)", run["caused_by"])
    }
    assert {link.context.trace_id for link in span.links} == parent_traces
    assert format(span.context.trace_id, "032x") == run["trace_id"]

    # Only B again: the child waits for a new A.
    await run_parent(api, stores, b, ["SUCCEEDED"], n=1)
    assert await fire_all(stores, publisher) == 0
    await run_parent(api, stores, a, ["SUCCEEDED"], n=1)
    assert await fire_all(stores, publisher) == 1


@pytest.mark.parametrize(("policy", "runs"), [("SKIP", 0), ("FIRE_ONCE", 1), ("FIRE_ALL", 3)])
async def test_triggers_that_waited_while_the_child_was_paused_follow_its_catch_up_policy(
    api: Api,  # noqa: F811
    stores: Stores,
    publisher: KafkaPublisher,
    policy: str,
    runs: int,
) -> None:
    a = await make(api, delayed())
    child = await make(api, dependent([a], catchupPolicy=policy, catchupWindowSec=60))
    assert (await api.client.post(f"/v1/jobs/{child}/pause", headers=api.auth())).status_code == 200
    await run_parent(api, stores, a, ["SUCCEEDED", "SUCCEEDED", "SUCCEEDED"])
    assert await fire_all(stores, publisher) == 0  # paused: the triggers wait
    await api.db.execute("UPDATE job_triggers SET created_at = created_at - interval '10 minutes'")
    assert (await api.client.post(f"/v1/jobs/{child}/resume", headers=api.auth())).status_code == 200
    await fire_all(stores, publisher)
    assert len(await children_executions(api.db, child)) == runs
    assert await api.db.fetchval("SELECT count(*) FROM job_triggers WHERE consumed_at IS NULL") == 0


# --- suspended tenants and fair dispatch's limits ------------------------------------------------------------


async def test_a_suspended_tenants_children_wait_and_go_out_once_on_resume(
    api: Api,  # noqa: F811
    stores: Stores,
    publisher: KafkaPublisher,
) -> None:
    a = await make(api, delayed())
    child = await make(api, dependent([a]))
    await register_tenant(api.settings.database_url, TENANT, state="SUSPENDED")
    parents = await run_parent(api, stores, a, ["SUCCEEDED", "SUCCEEDED"])

    assert await fire_all(stores, publisher, limits=side_limits(api, stores)) == 0
    assert await fire_all(stores, publisher) == 0  # fairness off too: suspension is not a fair-dispatch limit
    assert await children_executions(api.db, child) == []
    assert (await stores.dependencies.shards_with_side_work(range(4)))[0] == set(), "the census does not wake for them"
    waiting = (await api.client.get(f"/v1/jobs/{child}", headers=api.auth())).json()["parents"]
    assert waiting[0]["waiting"] == 2, "recorded and kept, not consumed"

    await register_tenant(api.settings.database_url, TENANT, state="ACTIVE")
    assert await fire_all(stores, publisher, passes=2) == 2
    assert await fire_all(stores, publisher) == 0
    rows = await children_executions(api.db, child)
    assert sorted(r["caused_by"][0] for r in rows) == sorted(parents)


async def finish_children(api: Api, job_id: str) -> None:  # noqa: F811
    await api.db.execute(
        "UPDATE executions SET state = 'SUCCEEDED', finished_at = now() WHERE job_id = $1 AND state = 'PENDING'",
        uuid.UUID(job_id),
    )


async def test_children_wait_for_their_tenants_concurrency_quota_without_holding_other_tenants_back(
    api: Api,  # noqa: F811
    stores: Stores,
    publisher: KafkaPublisher,
) -> None:
    await register_tenant(api.settings.database_url, TENANT, max_concurrent_executions=2)
    a = await make(api, delayed())
    child = await make(api, dependent([a]))
    theirs = await make(api, delayed(), tenant="globex")
    their_child = await make(api, dependent([theirs]), tenant="globex")
    # Both children on one shard, whose pass takes one child at a time.
    await api.db.execute("UPDATE jobs SET shard = 0 WHERE id = ANY($1::uuid[])", [child, their_child])
    limits = side_limits(api, stores)
    one_child = TriggerConfig(batch_children=1, batch_triggers=10)

    parents = await run_parent(api, stores, a, ["SUCCEEDED"] * 5)
    assert await fire_all(stores, publisher, limits=limits) == 2
    assert await fire_all(stores, publisher, limits=limits) == 0, "at its quota: the rest waits"
    # acme's child, first in trigger order, no longer fills the one-child batch ahead of globex's.
    await run_parent(api, stores, theirs, ["SUCCEEDED"], tenant="globex")
    assert await fire_all(stores, publisher, limits=limits, config=one_child) == 1
    assert len(await children_executions(api.db, their_child)) == 1

    for _ in range(3):  # the children finish: the quota frees and the waiting triggers go out, none twice
        await finish_children(api, child)
        await fire_all(stores, publisher, limits=limits)
    rows = await children_executions(api.db, child)
    assert sorted(r["caused_by"][0] for r in rows) == sorted(parents)


async def test_children_stay_within_a_pools_queue_cap_and_their_tenants_dispatch_rate(
    api: Api,  # noqa: F811
    stores: Stores,
    publisher: KafkaPublisher,
) -> None:
    a = await make(api, delayed())
    child = await make(api, dependent([a]))
    parents = await run_parent(api, stores, a, ["SUCCEEDED"] * 6)
    capped = side_limits(api, stores, pool_queue_cap=4)
    assert await fire_all(stores, publisher, limits=capped) == 4
    assert await fire_all(stores, publisher, limits=capped) == 0, "the pool's queue is full: the rest waits"
    await finish_children(api, child)
    assert await fire_all(stores, publisher, limits=capped) == 2

    await register_tenant(api.settings.database_url, TENANT, max_dispatch_per_sec=2)
    more = await run_parent(api, stores, a, ["SUCCEEDED"] * 5, n=1)
    rated = side_limits(api, stores)
    assert await fire_all(stores, publisher, limits=rated) == 2, "a second's worth of tokens"
    for _ in range(100):  # the bucket refills at 2/s: poll with a deadline
        if len(await children_executions(api.db, child)) == 11:
            break
        await asyncio.sleep(0.1)
        await fire_all(stores, publisher, limits=rated)
    rows = await children_executions(api.db, child)
    assert sorted(r["caused_by"][0] for r in rows) == sorted(parents + more)
    assert await api.db.fetchval("SELECT count(*) FROM job_triggers WHERE consumed_at IS NULL") == 0


async def test_cancelling_a_child_drops_the_triggers_it_was_waiting_on(
    api: Api,  # noqa: F811
    stores: Stores,
    publisher: KafkaPublisher,
) -> None:
    a = await make(api, delayed())
    b = await make(api, delayed())
    fan_in = await make(api, dependent([a, b]))  # waits for B
    paused = await make(api, dependent([a]))
    grandchild = await make(api, dependent([paused]))
    assert (await api.client.post(f"/v1/jobs/{paused}/pause", headers=api.auth())).status_code == 200
    await run_parent(api, stores, a, ["SUCCEEDED", "SUCCEEDED"])
    assert await fire_all(stores, publisher) == 0
    pending = "SELECT count(*) FROM job_triggers WHERE child_job_id = ANY($1::uuid[]) AND consumed_at IS NULL"
    assert await api.db.fetchval(pending, [fan_in, paused]) == 4

    assert (await api.client.delete(f"/v1/jobs/{fan_in}", headers=api.auth())).status_code == 200
    assert await api.db.fetchval(pending, [fan_in]) == 0, "the cancel's own statement dropped them"
    cascade = await api.client.delete(f"/v1/jobs/{paused}", params={"cascade": "true"}, headers=api.auth())
    assert cascade.status_code == 200, cascade.text
    assert await api.db.fetchval(pending, [paused, grandchild]) == 0
    assert await api.db.fetchval("SELECT count(*) FROM job_triggers WHERE consumed_at IS NOT NULL") == 0
    assert await fire_all(stores, publisher) == 0
