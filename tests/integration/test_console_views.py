"""The console's later views: pools with their live workers and backlog, the jobs list sorted by next fire with
its time-zone toggle, editing and deleting a job, and backfills.

In-process API on real Postgres and Redis, driven as a browser with JavaScript off would drive it (the
``Browser`` of ``test_console``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from redis.asyncio import Redis
from sundial_api.console.job_order import encode_cursor
from sundial_common.hotwindow.worker_announcements import WorkerAnnouncement, WorkerAnnouncements
from sundial_common.stores.jobs import JobFilter

from tests.integration.test_api import NOW, TENANT, Api, api, insert_execution
from tests.integration.test_console import Browser, a_job, browser, token

__all__ = ["api", "browser"]  # the fixtures


def announcement(pool: str, worker_id: str, *handlers: str) -> WorkerAnnouncement:
    return WorkerAnnouncement(
        worker_id=worker_id, pool=pool, handlers=handlers, concurrency=4, free_slots=3, version="test",
        host="host-a", pid=4242, started_at=datetime.now(UTC),
    )  # fmt: skip


async def test_pools_show_live_workers_backlog_and_the_no_live_worker_warning(api: Api, browser: Browser) -> None:
    job_id = await a_job(api, target={"pool": "reports", "handler": "render"})
    await insert_execution(api, job_id, NOW, pool="reports", handler="render")  # PENDING: waits for a worker
    announcements = WorkerAnnouncements(Redis.from_url(api.settings.redis_url))
    await announcements.announce(announcement("demo", "worker-in-demo", "echo", "<b>sleep</b>"), ttl_sec=60)
    page = await browser.http.get("/ui/pools")
    assert page.status_code == 200
    demo = page.text[page.text.index('data-pool="demo"') :]
    demo = demo[: demo.index("</tr>")]
    assert 'data-testid="pool-live-workers">1<' in demo and "<code>echo</code>" in demo
    assert "&lt;b&gt;sleep&lt;/b&gt;" in demo  # handler names come from workers: escaped like tenant text
    reports = page.text[page.text.index('data-pool="reports"') :]
    reports = reports[: reports.index("</tr>")]
    assert 'data-testid="pool-live-workers">0<' in reports and 'data-testid="pool-pending">1<' in reports
    assert "no live worker in pool reports: 1 of your executions wait for one" in page.text
    assert "worker-in-demo" in page.text and "host-a / 4242" in page.text
    # Another tenant's backlog in the same pool is not this tenant's.
    other = Browser(api)
    await other.sign_in(token(api, "other"))
    theirs = await other.http.get("/ui/pools")
    assert "wait for one" not in theirs.text
    await announcements.withdraw("demo", "worker-in-demo")


async def test_the_jobs_list_sorts_by_next_fire_and_shows_times_in_the_chosen_zone(api: Api, browser: Browser) -> None:
    later = await a_job(api, name="fires-later", runAt=(NOW + timedelta(hours=5)).isoformat(), timezone="Asia/Tokyo")
    sooner = await a_job(api, name="fires-sooner", runAt=(NOW + timedelta(hours=1)).isoformat())
    cancelled = await a_job(api, name="fires-never", runAt=(NOW + timedelta(hours=2)).isoformat())
    csrf = await browser.csrf()
    assert (await browser.http.post(f"/ui/jobs/{cancelled}/cancel", data={"csrf": csrf})).status_code == 303
    await a_job(api, tenant="other", name="fires-elsewhere", runAt=(NOW + timedelta(minutes=30)).isoformat())
    newest = await browser.http.get("/ui/jobs")
    assert newest.text.index("fires-never") < newest.text.index("fires-sooner") < newest.text.index("fires-later")
    by_fire = await browser.http.get("/ui/jobs", params={"sort": "next-fire"})
    assert by_fire.status_code == 200
    assert by_fire.text.index("fires-sooner") < by_fire.text.index("fires-later") < by_fire.text.index("fires-never")
    assert "fires-elsewhere" not in by_fire.text
    # Keyset pages in that order: two jobs a page would need 50; page through with the store's own cursor.
    rows = await api.app.state.api.stores.jobs.list_jobs_by_next_fire(TENANT, JobFilter(), None, 10)
    assert [str(r["id"]) for r in rows] == [sooner, later, cancelled]
    cursor = encode_cursor(rows[0]["next_fire_at"], rows[0]["id"])
    second = await browser.http.get("/ui/jobs", params={"sort": "next-fire", "cursor": cursor})
    assert "fires-sooner" not in second.text and "fires-later" in second.text and "First page" in second.text
    assert (
        'href="/ui/jobs?q=&amp;state=&amp;type=&amp;pool=&amp;handler=&amp;label=&amp;sort=next-fire&amp;tz=utc"'
        in (second.text)
    )
    # Times: UTC by default, the job's own zone, or marked for the browser's zone.
    tokyo = (NOW + timedelta(hours=5)).astimezone(ZoneInfo("Asia/Tokyo")).strftime("%Y-%m-%d %H:%M:%S JST")
    in_job_zone = await browser.http.get("/ui/jobs", params={"tz": "job"})
    assert tokyo in in_job_zone.text
    in_utc = await browser.http.get("/ui/jobs")
    assert tokyo not in in_utc.text and (NOW + timedelta(hours=5)).strftime("%Y-%m-%d %H:%M:%S UTC") in in_utc.text
    local = await browser.http.get("/ui/jobs", params={"tz": "local"})
    assert "data-local" in local.text
    for params, field in (
        ({"sort": "random"}, "sort"),
        ({"tz": "mars"}, "tz"),
        ({"sort": "next-fire", "cursor": "x"}, "cursor"),
    ):
        refused = await browser.http.get("/ui/jobs", params=params)
        assert refused.status_code == 422 and field in refused.text, params
