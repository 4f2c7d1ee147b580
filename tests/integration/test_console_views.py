"""The console's later views: pools with their live workers and backlog, the jobs list sorted by next fire with
its time-zone toggle, editing and deleting a job, and backfills.

In-process API on real Postgres and Redis, driven as a browser with JavaScript off would drive it (the
``Browser`` of ``test_console``).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from redis.asyncio import Redis
from sundial_common.hotwindow.worker_announcements import WorkerAnnouncement, WorkerAnnouncements

from tests.integration.test_api import NOW, TENANT, Api, api, insert_execution
from tests.integration.test_console import Browser, a_job, browser, csrf_of, token

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
