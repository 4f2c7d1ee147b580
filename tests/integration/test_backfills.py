"""Backfills on real Postgres and the broker: the API's checks and dry run (in-process), and the shard leader's
fenced steps that create exactly the missing executions, at the requested rate, resumable and cancellable."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

from sundial_common.broker.kafka import KafkaPublisher
from sundial_common.domain.ids import new_id
from sundial_common.stores import Stores
from sundial_dispatcher.backfills import BackfillConfig, BackfillDispatcher
from sundial_dispatcher.limits import SideLimits

from tests.integration.test_dependencies import side_limits
from tests.support.api import NOW, TENANT, Api, api, error_fields, rfc3339  # noqa: F401  (the `api` fixture)
from tests.support.tenants import register_tenant

START = NOW.replace(second=0, microsecond=0) - timedelta(hours=2)


async def interval_job(api: Api) -> tuple[str, int]:  # noqa: F811
    body = {
        "name": "hourly-report",
        "type": "INTERVAL",
        "intervalSec": 60,
        "startAt": rfc3339(START),
        "target": {"pool": "demo", "handler": "echo"},
    }
    response = await api.create(body)
    assert response.status_code == 201, response.text
    job_id = response.json()["jobId"]
    return job_id, await api.db.fetchval("SELECT shard FROM jobs WHERE id = $1", uuid.UUID(job_id))


def minutes(n: int) -> str:
    return rfc3339(START + timedelta(minutes=n))


async def backfill(api: Api, job_id: str, **fields: Any) -> Any:  # noqa: F811
    return await api.client.post(f"/v1/jobs/{job_id}:backfill", json=fields, headers=api.auth())


async def step(
    stores: Stores, publisher: KafkaPublisher, shard: int, *, budget_sec: float = 1.0, limits: SideLimits | None = None
) -> int:
    """A new term on the job's shard and one leader step, its rate budget ``budget_sec`` old."""
    await stores.database.pool.execute("UPDATE backfills SET stepped_at = now() - $1 * interval '1 second'", budget_sec)
    token = await stores.dispatch.take_shard(shard, "test")
    leader = BackfillDispatcher(
        shard, token, "test", stores.backfills, stores.dispatch, publisher, BackfillConfig(), limits=limits
    )
    return (await leader.run_once()).created


async def test_a_range_that_partly_has_executions_gets_exactly_the_missing_ones(
    api: Api,  # noqa: F811
    stores: Stores,
    publisher: KafkaPublisher,
) -> None:
    job_id, shard = await interval_job(api)
    job = uuid.UUID(job_id)
    # Occurrences 30..59 (minutes after startAt) are the range; every third already ran.
    for n in range(30, 60, 3):
        await api.db.execute(
            "INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler, state,"
            " timeout_sec) VALUES ($1, 'acme', $2, $3, $4, 1, 'demo', 'echo', 'SUCCEEDED', 60)",
            new_id(),
            job,
            START + timedelta(minutes=n),
            shard,
        )
    dry = await backfill(api, job_id, **{"from": minutes(30), "to": minutes(60), "dryRun": True})
    assert dry.status_code == 200, dry.text
    assert dry.json()["count"] == 20
    assert dry.json()["first"][:2] == [minutes(31), minutes(32)]
    assert await api.db.fetchval("SELECT count(*) FROM backfills") == 0

    created = await backfill(api, job_id, **{"from": minutes(30), "to": minutes(60), "ratePerSec": 5})
    assert created.status_code == 202, created.text
    view = created.json()
    assert (view["state"], view["total"], view["created"]) == ("RUNNING", 20, 0)
    location = created.headers["location"]

    # Rate-bounded: one second of budget at 5/s covers 5 occurrences (minutes 30–34; 30 and 33 already ran);
    # each step is a new leader term (a crash between steps resumes from the committed cursor).
    assert await step(stores, publisher, shard) == 3
    progress = (await api.client.get(location, headers=api.auth())).json()
    assert (progress["created"], progress["state"], progress["cursor"]) == (3, "RUNNING", minutes(34))
    steps = 0
    while (await api.client.get(location, headers=api.auth())).json()["state"] == "RUNNING":
        await step(stores, publisher, shard)
        steps += 1
        assert steps < 10
    done = (await api.client.get(location, headers=api.auth())).json()
    assert (done["state"], done["created"], done["total"]) == ("DONE", 20, 20)

    rows = await api.db.fetch(
        "SELECT scheduled_for, count(*) FROM executions WHERE job_id = $1 GROUP BY scheduled_for", job
    )
    in_range = [r for r in rows if START + timedelta(minutes=30) <= r["scheduled_for"] < START + timedelta(minutes=60)]
    assert len(in_range) == 30 and {r["count"] for r in in_range} == {1}
    assert await api.db.fetchval("SELECT count(*) FROM executions WHERE backfill_id IS NOT NULL") == 20
    again = await backfill(api, job_id, **{"from": minutes(30), "to": minutes(60), "dryRun": True})
    assert again.json()["count"] == 0


async def test_a_cancelled_backfill_creates_nothing_more(
    api: Api,  # noqa: F811
    stores: Stores,
    publisher: KafkaPublisher,
) -> None:
    job_id, shard = await interval_job(api)
    created = (await backfill(api, job_id, **{"from": minutes(0), "to": minutes(100), "ratePerSec": 10})).json()
    assert await step(stores, publisher, shard) == 10
    cancel = await api.client.post(f"/v1/backfills/{created['backfillId']}/cancel", headers=api.auth())
    assert cancel.status_code == 200 and cancel.json()["state"] == "CANCELLED"
    assert await step(stores, publisher, shard) == 0
    again = await api.client.post(f"/v1/backfills/{created['backfillId']}/cancel", headers=api.auth())
    assert again.status_code == 200  # idempotent
    assert await api.db.fetchval("SELECT count(*) FROM executions") == 10


async def test_cancelling_the_job_ends_its_running_backfill(
    api: Api,  # noqa: F811
    stores: Stores,
    publisher: KafkaPublisher,
) -> None:
    job_id, shard = await interval_job(api)
    created = (await backfill(api, job_id, **{"from": minutes(0), "to": minutes(100), "ratePerSec": 10})).json()
    assert await step(stores, publisher, shard) == 10
    assert (await api.client.delete(f"/v1/jobs/{job_id}", headers=api.auth())).status_code == 200
    view = (await api.client.get(f"/v1/backfills/{created['backfillId']}", headers=api.auth())).json()
    assert (view["state"], view["created"]) == ("CANCELLED", 10)
    assert await step(stores, publisher, shard) == 0
    assert await api.db.fetchval("SELECT count(*) FROM executions") == 10


async def test_bad_ranges_are_refused_naming_the_field_and_nothing_is_written(api: Api) -> None:  # noqa: F811
    job_id, _ = await interval_job(api)
    one_shot = (
        await api.create(
            {"name": "once", "type": "DELAYED", "delaySeconds": 60, "target": {"pool": "demo", "handler": "echo"}}
        )
    ).json()["jobId"]
    cases: list[tuple[str, dict[str, Any], str]] = [
        (job_id, {"from": minutes(10), "to": minutes(10)}, "to"),
        (job_id, {"from": minutes(10), "to": rfc3339(NOW + timedelta(minutes=1))}, "to"),
        (job_id, {"from": minutes(-10), "to": minutes(10)}, "from"),
        (job_id, {"from": rfc3339(NOW - timedelta(days=31)), "to": minutes(10)}, "from"),  # beyond retention
        (job_id, {"from": minutes(0), "to": minutes(10), "ratePerSec": 0}, "ratePerSec"),
        (job_id, {"from": minutes(0), "to": minutes(10), "overlapPolicy": "SKIP"}, "overlapPolicy"),
        (one_shot, {"from": minutes(0), "to": minutes(10)}, "jobId"),
    ]
    for target, fields, field in cases:
        response = await backfill(api, target, **fields)
        assert response.status_code == 422, response.text
        assert error_fields(response) == [field], response.text
    missing = await backfill(api, str(uuid.uuid4()), **{"from": minutes(0), "to": minutes(10)})
    assert missing.status_code == 404
    assert await api.db.fetchval("SELECT count(*) FROM backfills") == 0


async def backfilled(api: Api, job_id: str) -> list[Any]:  # noqa: F811
    """The backfill's executions' nominal times, in order (each once, or the test sees the repeat)."""
    rows = await api.db.fetch(
        "SELECT scheduled_for FROM executions WHERE job_id = $1 AND backfill_id IS NOT NULL ORDER BY scheduled_for",
        uuid.UUID(job_id),
    )
    return [r["scheduled_for"] for r in rows]


async def test_a_suspended_tenants_backfill_waits_and_resumes_where_it_was(
    api: Api,  # noqa: F811
    stores: Stores,
    publisher: KafkaPublisher,
) -> None:
    job_id, shard = await interval_job(api)
    created = (await backfill(api, job_id, **{"from": minutes(0), "to": minutes(15), "ratePerSec": 10})).json()
    assert await step(stores, publisher, shard) == 10
    await register_tenant(api.settings.database_url, TENANT, state="SUSPENDED")
    assert await step(stores, publisher, shard) == 0
    assert await step(stores, publisher, shard, limits=side_limits(api, stores)) == 0
    assert (await stores.dependencies.shards_with_side_work(range(4)))[1] == set(), "the census does not wake for it"
    view = (await api.client.get(f"/v1/backfills/{created['backfillId']}", headers=api.auth())).json()
    assert (view["state"], view["created"], view["cursor"]) == ("RUNNING", 10, minutes(9))

    await register_tenant(api.settings.database_url, TENANT, state="ACTIVE")
    assert await step(stores, publisher, shard) == 5
    assert await backfilled(api, job_id) == [START + timedelta(minutes=n) for n in range(15)]


async def test_a_backfill_stays_within_its_tenants_concurrency_quota_and_dispatch_rate(
    api: Api,  # noqa: F811
    stores: Stores,
    publisher: KafkaPublisher,
) -> None:
    job_id, shard = await interval_job(api)
    await register_tenant(api.settings.database_url, TENANT, max_concurrent_executions=3)
    created = (await backfill(api, job_id, **{"from": minutes(0), "to": minutes(12), "ratePerSec": 10})).json()
    limits = side_limits(api, stores)
    assert await step(stores, publisher, shard, limits=limits) == 3
    assert await step(stores, publisher, shard, limits=limits) == 0, "at its quota: the range waits behind the cursor"
    await api.db.execute("UPDATE executions SET state = 'SUCCEEDED', finished_at = now()")
    assert await step(stores, publisher, shard, limits=limits) == 3

    # The dispatch rate, shared with the tenant's other dispatch: 2 tokens a second, the cursor stops at the last.
    await register_tenant(api.settings.database_url, TENANT, max_concurrent_executions=None, max_dispatch_per_sec=2)
    assert await step(stores, publisher, shard, limits=limits) == 2
    location = f"/v1/backfills/{created['backfillId']}"
    view = (await api.client.get(location, headers=api.auth())).json()
    assert (view["created"], view["cursor"]) == (8, minutes(7))
    for _ in range(100):  # the bucket refills at 2/s: poll with a deadline
        if (await api.client.get(location, headers=api.auth())).json()["state"] == "DONE":
            break
        await asyncio.sleep(0.1)
        await step(stores, publisher, shard, limits=limits)
    assert await backfilled(api, job_id) == [START + timedelta(minutes=n) for n in range(12)]
