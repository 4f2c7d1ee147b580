"""Recurring jobs over the HTTP API, on real Postgres and Redis: create, validate, preview, pause, resume,
trigger and PATCH. Each test checks what the client sees and what was written (job row, audit row, the
hot-window member and its score); each refused request is checked to have written nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from sundial_api.models.jobs import Job
from sundial_api.models.schedules import Preview
from sundial_common.domain.schedules import jitter

from tests.support.api import Api, error_fields, ms, rfc3339, serving_api

# A fixed, millisecond-aligned "now": a fixed date, so no expectation depends on where the wall clock stands —
# 20 minutes into the hour (an hourly fire plus 10 min of jitter stays inside the 60-min hot window), mid-January
# (no DST change near it, and "0 0 1 1 *" is months away), before the fixed DST dates the previews below
# ask about (a start in the past is clamped to now).
NOW = datetime(2030, 1, 15, 10, 20, 7, 250000, tzinfo=UTC)
MIN_INTERVAL_SEC = 10


@pytest.fixture
async def api(database_url: str, redis_url: str) -> AsyncIterator[Api]:
    async with serving_api(database_url, redis_url, now=NOW, min_interval_sec=MIN_INTERVAL_SEC) as served:
        yield served


def cron(schedule: str | None = "*/5 * * * *", **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "report",
        "type": "CRON",
        "schedule": schedule,
        "target": {"pool": "reports", "handler": "build"},
    }
    body.update(overrides)
    return body


def without(body: dict[str, Any], *names: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in names}


def instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def job_row(api: Api, job_id: str) -> asyncpg.Record:
    row = await api.db.fetchrow("SELECT * FROM jobs WHERE id = $1", uuid.UUID(job_id))
    assert row is not None
    return row


async def created(api: Api, body: dict[str, Any]) -> dict[str, Any]:
    response = await api.create(body)
    assert response.status_code == 201, response.text
    Job.model_validate(response.json())
    return response.json()  # type: ignore[no-any-return]


def next_minute_multiple(n: int) -> datetime:
    step = timedelta(minutes=n)
    base = NOW.replace(minute=0, second=0, microsecond=0)
    while base <= NOW:
        base += step
    return base


# --- create ------------------------------------------------------------------------------------------


async def test_a_cron_job_is_stored_with_its_next_fire_and_put_in_the_hot_window(api: Api) -> None:
    response = await api.create(cron("*/5 * * * *"))

    assert response.status_code == 201, response.text
    job = response.json()
    expected = next_minute_multiple(5)
    assert instant(job["nextFireAt"]) == instant(job["nextScheduledFor"]) == expected
    assert (job["state"], job["schedule"], job["missedFires"], job["fireCount"]) == ("ACTIVE", "*/5 * * * *", 0, 0)
    assert (job["overlapPolicy"], job["catchupPolicy"], job["catchupWindowSec"]) == ("ALLOW", "FIRE_ONCE", 60)
    assert response.headers["etag"] == '"1"'
    row = await job_row(api, job["jobId"])
    assert row["next_fire_at"] == row["next_nominal_at"] == expected
    assert await api.score(row["shard"], job["jobId"]) == ms(expected)
    assert await api.db.fetchval("SELECT action FROM audit_log WHERE entity_id = $1", row["id"]) == "create"


async def test_a_cron_job_follows_its_own_time_zone(api: Api) -> None:
    job = await created(api, cron("0 9 * * *", timezone="Asia/Kolkata"))
    fire = instant(job["nextFireAt"])
    assert (fire.hour, fire.minute) == (3, 30)  # 09:00 IST, whatever the server's zone


async def test_jitter_delays_the_fire_deterministically_and_keeps_the_nominal_time(api: Api) -> None:
    job = await created(api, cron("0 * * * *", jitterSec=600))
    nominal, actual = instant(job["nextScheduledFor"]), instant(job["nextFireAt"])
    assert actual - nominal == jitter(uuid.UUID(job["jobId"]), nominal, 600)
    assert timedelta(0) <= actual - nominal < timedelta(seconds=600)
    row = await job_row(api, job["jobId"])
    assert await api.score(row["shard"], job["jobId"]) == ms(actual)


async def test_an_interval_job_is_anchored_one_interval_from_now_or_at_start_at(api: Api) -> None:
    every_90s = without(cron(type="INTERVAL", intervalSec=90), "schedule")
    job = await created(api, every_90s)
    assert instant(job["nextFireAt"]) == instant(job["startAt"]) == NOW + timedelta(seconds=90)
    anchor = NOW - timedelta(seconds=100)
    job = await created(api, {**every_90s, "intervalSec": 60, "startAt": rfc3339(anchor)})
    assert instant(job["nextFireAt"]) == anchor + timedelta(seconds=120)  # on the anchor's grid, not now + 60


async def test_a_run_list_fires_its_instants_in_order(api: Api) -> None:
    instants = [NOW + timedelta(hours=h) for h in (3, 1, 2, 1)]
    job = await created(api, cron(type="RUN_LIST", schedule=None, runList=[rfc3339(i) for i in instants]))
    assert [instant(i) for i in job["runList"]] == sorted(set(instants))
    assert instant(job["nextFireAt"]) == NOW + timedelta(hours=1)


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("cron minute out of range", cron("61 * * * *"), "schedule"),
    ("cron with three fields", cron("* * *"), "schedule"),
    ("cron that never fires", cron("0 0 30 2 *"), "schedule"),
    ("cron missing", without(cron(), "schedule"), "schedule"),
    (
        "interval below the minimum",
        without(cron(type="INTERVAL", intervalSec=MIN_INTERVAL_SEC - 1), "schedule"),
        "intervalSec",
    ),
    ("interval zero", without(cron(type="INTERVAL", intervalSec=0), "schedule"), "intervalSec"),
    (
        "endAt before startAt",
        cron(startAt=rfc3339(NOW + timedelta(days=2)), endAt=rfc3339(NOW + timedelta(days=1))),
        "endAt",
    ),
    ("endAt before the first fire", cron("0 0 1 1 *", endAt=rfc3339(NOW + timedelta(days=1))), "endAt"),
    (
        "run list over 1000",
        without(cron(type="RUN_LIST", runList=[rfc3339(NOW + timedelta(minutes=1))] * 1001), "schedule"),
        "runList",
    ),
    (
        "run list instant long past",
        without(
            cron(type="RUN_LIST", runList=[rfc3339(NOW + timedelta(minutes=1)), rfc3339(NOW - timedelta(minutes=5))]),
            "schedule",
        ),
        "runList[1]",
    ),
    ("run list instant not an instant", without(cron(type="RUN_LIST", runList=["noon"]), "schedule"), "runList[0]"),
    ("unknown time zone", cron(timezone="America/Springfield"), "timezone"),
    ("policy unknown", cron(overlapPolicy="QUEUE"), "overlapPolicy"),
    ("catch-up window zero", cron(catchupWindowSec=0), "catchupWindowSec"),
    ("maxRuns zero", cron(maxRuns=0), "maxRuns"),
    ("schedule on an interval job", cron(type="INTERVAL", intervalSec=60), "schedule"),
    (
        "startAt on a one-shot",
        {**without(cron(type="ONE_SHOT"), "schedule"), "runAt": rfc3339(NOW), "startAt": rfc3339(NOW)},
        "startAt",
    ),
]


@pytest.mark.parametrize(("case", "body", "field"), BAD, ids=[c[0] for c in BAD])
async def test_bad_schedules_name_the_field_and_write_nothing(
    api: Api, case: str, body: dict[str, Any], field: str
) -> None:
    response = await api.create(body)
    assert response.status_code == 422, response.text
    assert field in error_fields(response), response.text
    assert await api.counts() == {"jobs": 0, "audit_log": 0, "executions": 0}
    assert await api.redis.dbsize() == 0


# --- preview -----------------------------------------------------------------------------------------


async def test_preview_lists_the_next_fires_in_utc_and_in_the_jobs_zone(api: Api) -> None:
    job = await created(api, cron("0 * * * *", timezone="America/New_York", jitterSec=30))
    response = await api.client.get(f"/v1/jobs/{job['jobId']}/preview", params={"count": 5}, headers=api.auth())

    assert response.status_code == 200, response.text
    view = Preview.model_validate(response.json())
    assert view.timezone == "America/New_York" and len(view.fires) == 5
    assert view.fires[0].fire_at == instant(job["nextFireAt"])
    assert view.fires[0].scheduled_for == instant(job["nextScheduledFor"])
    assert all(
        b.scheduled_for - a.scheduled_for == timedelta(hours=1)
        for a, b in zip(view.fires, view.fires[1:], strict=False)
    )
    assert all(f.local.endswith(("-04:00", "-05:00")) and f.local[14:19] == "00:00" for f in view.fires)


async def test_preview_of_a_schedule_shows_dst_before_any_job_exists(api: Api) -> None:
    body = {
        "type": "CRON",
        "schedule": "0 * * * *",
        "timezone": "America/New_York",
        "startAt": "2030-11-03T00:00:00",  # naive: New York wall-clock time
        "count": 4,
    }
    response = await api.client.post("/v1/schedules:preview", json=body, headers=api.auth())

    assert response.status_code == 200, response.text
    fires = response.json()["fires"]
    # Fall-back day: an hourly job runs every real hour, so 01:00 appears twice.
    assert [f["local"] for f in fires] == [
        "2030-11-03T00:00:00-04:00",
        "2030-11-03T01:00:00-04:00",
        "2030-11-03T01:00:00-05:00",
        "2030-11-03T02:00:00-05:00",
    ]
    assert [f["scheduledFor"] for f in fires] == [f["fireAt"] for f in fires]
    assert (await api.counts())["jobs"] == 0

    spring = {**body, "schedule": "30 2 * * *", "startAt": "2030-03-09T00:00:00", "count": 2}
    fires = (await api.client.post("/v1/schedules:preview", json=spring, headers=api.auth())).json()["fires"]
    assert [f["local"] for f in fires] == ["2030-03-09T02:30:00-05:00", "2030-03-10T03:00:00-04:00"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"type": "CRON", "schedule": "* * *"}, "schedule"),
        ({"type": "CRON", "schedule": "* * * * *", "count": 1001}, "count"),
        ({"type": "INTERVAL"}, "intervalSec"),
        ({"type": "CRON", "schedule": "* * * * *", "target": {"pool": "x"}}, "target"),
    ],
)
async def test_a_bad_schedule_preview_names_the_field(api: Api, body: dict[str, Any], field: str) -> None:
    response = await api.client.post("/v1/schedules:preview", json=body, headers=api.auth())
    assert response.status_code == 422 and field in error_fields(response), response.text


# --- pause, resume, trigger --------------------------------------------------------------------------


async def test_pause_takes_the_job_out_of_the_hot_window_and_resume_puts_it_back(api: Api) -> None:
    job = await created(api, cron("* * * * *"))
    shard = (await job_row(api, job["jobId"]))["shard"]
    url = f"/v1/jobs/{job['jobId']}"

    paused = await api.client.post(f"{url}/pause", headers=api.auth())
    assert paused.status_code == 200 and paused.json()["state"] == "PAUSED" and paused.json()["version"] == 2
    assert await api.score(shard, job["jobId"]) is None
    assert (await api.client.post(f"{url}/pause", headers=api.auth())).json()["version"] == 2  # idempotent

    resumed = await api.client.post(f"{url}/resume", headers=api.auth())
    assert resumed.status_code == 200 and resumed.json()["state"] == "ACTIVE" and resumed.json()["version"] == 3
    assert await api.score(shard, job["jobId"]) == ms(instant(job["nextFireAt"]))
    actions = await api.db.fetch(
        "SELECT action FROM audit_log WHERE entity_id = $1 ORDER BY id", uuid.UUID(job["jobId"])
    )
    assert [a["action"] for a in actions] == ["create", "pause", "resume"]

    await api.client.delete(url, headers=api.auth())
    for verb in ("pause", "resume"):
        refused = await api.client.post(f"{url}/{verb}", headers=api.auth())
        assert refused.status_code == 409, refused.text


async def test_trigger_runs_once_now_without_moving_the_schedule(api: Api) -> None:
    job = await created(api, cron("0 0 1 1 *"))  # next fire months away: beyond the hot window
    row = await job_row(api, job["jobId"])
    url = f"/v1/jobs/{job['jobId']}/trigger"

    response = await api.client.post(url, headers=api.auth())

    assert response.status_code == 202, response.text
    triggered = response.json()
    assert response.headers["location"] == f"/v1/executions/{triggered['executionId']}"
    assert instant(triggered["scheduledFor"]) == NOW
    after = await job_row(api, job["jobId"])
    assert (after["next_fire_at"], after["version"]) == (row["next_fire_at"], row["version"])
    assert str(after["trigger_execution_id"]) == triggered["executionId"]
    assert await api.score(row["shard"], job["jobId"]) == ms(NOW)  # the dispatcher picks it up at once
    again = await api.client.post(url, headers=api.auth())
    assert again.json()["executionId"] == triggered["executionId"]  # a double click runs once


# --- PATCH -------------------------------------------------------------------------------------------


async def test_patch_changes_the_schedule_from_the_next_occurrence_with_optimistic_concurrency(api: Api) -> None:
    job = await created(api, cron("0 * * * *", payload={"v": 1}))
    url = f"/v1/jobs/{job['jobId']}"
    shard = (await job_row(api, job["jobId"]))["shard"]

    stale = await api.client.patch(url, json={"schedule": "*/10 * * * *"}, headers={**api.auth(), "If-Match": '"7"'})
    assert stale.status_code == 412, stale.text
    assert error_fields(stale) == ["If-Match"] and stale.headers["etag"] == '"1"'

    changed = await api.client.patch(
        url, json={"schedule": "*/10 * * * *", "payload": {"v": 2}}, headers={**api.auth(), "If-Match": '"1"'}
    )
    assert changed.status_code == 200, changed.text
    view = changed.json()
    assert (view["schedule"], view["payload"], view["version"]) == ("*/10 * * * *", {"v": 2}, 2)
    assert instant(view["nextFireAt"]) == next_minute_multiple(10)
    assert changed.headers["etag"] == '"2"'
    assert await api.score(shard, job["jobId"]) == ms(next_minute_multiple(10))
    detail = await api.db.fetchval(
        "SELECT detail FROM audit_log WHERE entity_id = $1 AND action = 'update'", uuid.UUID(job["jobId"])
    )
    assert detail is not None and "payload" in detail and "schedule" in detail

    # A change that is not about time leaves the next fire where it is.
    renamed = (await api.client.patch(url, json={"name": "renamed"}, headers=api.auth())).json()
    assert renamed["nextFireAt"] == view["nextFireAt"] and renamed["version"] == 3


async def test_patch_can_change_the_type_and_end_the_schedule(api: Api) -> None:
    job = await created(api, cron("0 * * * *"))
    url = f"/v1/jobs/{job['jobId']}"
    interval = (await api.client.patch(url, json={"type": "INTERVAL", "intervalSec": 600}, headers=api.auth())).json()
    assert (interval["type"], interval["schedule"], interval["intervalSec"]) == ("INTERVAL", None, 600)
    assert instant(interval["nextFireAt"]) == NOW + timedelta(seconds=600)

    ended = await api.client.patch(url, json={"maxRuns": 1}, headers=api.auth())
    assert ended.status_code == 200 and ended.json()["maxRuns"] == 1 and ended.json()["state"] == "ACTIVE"
    await api.db.execute("UPDATE jobs SET fire_count = 1 WHERE id = $1", uuid.UUID(job["jobId"]))
    completed = await api.client.patch(url, json={"maxRuns": 1, "intervalSec": 300}, headers=api.auth())
    assert completed.json()["state"] == "COMPLETED" and completed.json()["nextFireAt"] is None
    assert (await api.client.patch(url, json={"name": "x"}, headers=api.auth())).status_code == 409


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"schedule": "61 * * * *"}, "schedule"),
        ({"intervalSec": 60}, "intervalSec"),
        ({"timezone": "Mars/Base"}, "timezone"),
        ({"colour": "red"}, "colour"),
        ({"endAt": "2000-01-01T00:00:00Z"}, "endAt"),
        ({"target": {"pool": "Bad Pool", "handler": "x"}}, "target.pool"),
    ],
)
async def test_a_bad_patch_names_the_field_and_changes_nothing(api: Api, patch: dict[str, Any], field: str) -> None:
    job = await created(api, cron())
    before = await job_row(api, job["jobId"])
    response = await api.client.patch(f"/v1/jobs/{job['jobId']}", json=patch, headers=api.auth())
    assert response.status_code == 422 and field in error_fields(response), response.text
    assert await job_row(api, job["jobId"]) == before
