"""The console's later views: pools with their live workers and backlog, the jobs list sorted by next fire with
its time-zone toggle, editing and deleting a job, and backfills.

In-process API on real Postgres and Redis, driven as a browser with JavaScript off would drive it (the
``Browser`` of ``test_console``).
"""

from __future__ import annotations

import asyncio
import html
import re
import threading
import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from sundial_api.console import events
from sundial_api.console.job_order import encode_cursor
from sundial_common.hotwindow.worker_announcements import WorkerAnnouncement, WorkerAnnouncements
from sundial_common.stores.jobs import JobFilter

from tests.integration.test_console import Browser, a_job, browser, csrf_of, token
from tests.support.api import NOW, TENANT, Api, api, insert_execution

__all__ = ["api", "browser"]  # the fixtures


def announcement(pool: str, worker_id: str, *handlers: str) -> WorkerAnnouncement:
    return WorkerAnnouncement(
        worker_id=worker_id, pool=pool, handlers=handlers, concurrency=4, free_slots=3, version="test",
        host="host-a", pid=4242, started_at=datetime.now(UTC),
    )  # fmt: skip


async def test_pools_show_live_workers_backlog_and_the_no_live_worker_warning(api: Api, browser: Browser) -> None:
    job_id = await a_job(api, target={"pool": "reports", "handler": "render"})
    await insert_execution(api, job_id, NOW, pool="reports", handler="render")  # PENDING: waits for a worker
    announcements = WorkerAnnouncements(api.redis)
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
    assert (
        await browser.http.post(f"/ui/jobs/{cancelled}/cancel", data={"csrf": csrf, "confirm": "yes"})
    ).status_code == 303
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
    jobs = api.app.state.api.stores.jobs
    after_later = await jobs.list_jobs_by_next_fire(TENANT, JobFilter(), (rows[1]["next_fire_at"], rows[1]["id"]), 10)
    assert [str(r["id"]) for r in after_later] == [cancelled]  # then the jobs with no next fire
    assert await jobs.list_jobs_by_next_fire(TENANT, JobFilter(), (None, rows[2]["id"]), 10) == []
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


async def test_a_job_is_edited_with_its_version_and_deleted_with_a_confirmation(api: Api, browser: Browser) -> None:
    job_id = await a_job(
        api, name="hourly", type="CRON", schedule="0 * * * *", timezone="Europe/Paris", runAt=None,
        target={"pool": "demo", "handler": "echo"}, retryPolicy={"maxAttempts": 3, "backoff": "FIXED"},
    )  # fmt: skip
    form = await browser.http.get(f"/ui/jobs/{job_id}/edit")
    assert form.status_code == 200 and 'value="0 * * * *"' in form.text and 'name="version" value="1"' in form.text
    fields = dict(re.findall(r'<input id="(\w+)" name="\w+"[^>]* value="([^"]*)"', form.text))
    payload = re.search(r'<textarea id="payload"[^>]*>(.*?)</textarea>', form.text, re.S)
    assert payload and '"userId": 42' in html.unescape(payload.group(1))
    fields.update(payload=html.unescape(payload.group(1)), type="CRON")
    sent = {**fields, "csrf": csrf_of(form.text), "version": "1"}
    # Bad input shows the form again, naming the field; nothing is written.
    bad = await browser.http.post(f"/ui/jobs/{job_id}/edit", data={**sent, "schedule": "61 * * * *"})
    assert bad.status_code == 422 and "schedule" in bad.text and "The job was not changed" in bad.text
    saved = await browser.http.post(
        f"/ui/jobs/{job_id}/edit", data={**sent, "schedule": "30 6 * * *", "maxAttempts": "5", "name": "daily"}
    )
    assert saved.status_code == 303 and saved.headers["location"] == f"/ui/jobs/{job_id}?notice=edited", saved.text
    row = await api.db.fetchrow(
        "SELECT name, schedule, version, retry_policy FROM jobs WHERE id = $1", uuid.UUID(job_id)
    )
    assert (row["name"], row["schedule"], row["version"]) == ("daily", "30 6 * * *", 2)
    assert '"maxAttempts": 5' in row["retry_policy"] and '"FIXED"' in row["retry_policy"]  # the rest kept
    detail = await api.db.fetchval(
        "SELECT detail FROM audit_log WHERE entity_id = $1 AND action = 'update'", uuid.UUID(job_id)
    )
    assert '"changed": ["name", "retryPolicy", "schedule"]' in detail
    # Sent on the version the form was opened on (1), now stale: refused, not overwritten.
    stale = await browser.http.post(f"/ui/jobs/{job_id}/edit", data={**sent, "name": "lost-update"})
    assert stale.status_code == 412 and "Start again from the job as it is now" in stale.text
    assert await api.db.fetchval("SELECT name FROM jobs WHERE id = $1", uuid.UUID(job_id)) == "daily"
    # Delete: only with the confirmation box ticked; the job is CANCELLED and its deletion audited.
    csrf = csrf_of(stale.text)
    assert (await browser.http.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": csrf})).status_code == 422
    deleted = await browser.http.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": csrf, "confirm": "yes"})
    assert deleted.status_code == 303 and deleted.headers["location"].endswith("?notice=deleted")
    assert await api.db.fetchval("SELECT state FROM jobs WHERE id = $1", uuid.UUID(job_id)) == "CANCELLED"
    assert (
        await api.db.fetchval(
            "SELECT count(*) FROM audit_log WHERE entity_id = $1 AND action = 'cancel'", uuid.UUID(job_id)
        )
        == 1
    )
    assert (await browser.http.get(f"/ui/jobs/{job_id}/edit")).status_code == 200
    assert (
        await browser.http.post(f"/ui/jobs/{job_id}/edit", data={**sent, "version": "3", "name": "x"})
    ).status_code == 409


async def test_a_backfill_starts_as_a_dry_run_then_runs_and_is_cancelled(api: Api, browser: Browser) -> None:
    job_id = await a_job(api, name="hourly", type="CRON", schedule="0 * * * *", runAt=None)
    page = await browser.http.get(f"/ui/jobs/{job_id}")
    assert f"/ui/jobs/{job_id}/backfills" in page.text
    form = await browser.http.get(f"/ui/jobs/{job_id}/backfills")
    assert form.status_code == 200 and 'name="dryRun" value="yes" checked' in form.text  # a dry run by default
    hour = NOW.replace(minute=0, second=0, microsecond=0)
    start, end = (hour - timedelta(hours=3)).isoformat(), (hour - timedelta(minutes=30)).isoformat()
    sent = {"csrf": csrf_of(form.text), "from": start, "to": end, "ratePerSec": "5", "overlapPolicy": "ALLOW"}
    dry = await browser.http.post(f"/ui/jobs/{job_id}/backfills", data={**sent, "dryRun": "yes"})
    assert dry.status_code == 200 and 'data-testid="backfill-count">3<' in dry.text, dry.text[:3000]
    assert await api.db.fetchval("SELECT count(*) FROM backfills") == 0  # counted, nothing created
    # The real run needs the confirmation the dry run's answer asks for.
    assert (await browser.http.post(f"/ui/jobs/{job_id}/backfills", data=sent)).status_code == 422
    started = await browser.http.post(f"/ui/jobs/{job_id}/backfills", data={**sent, "confirm": "yes"})
    assert started.status_code == 303, started.text[:3000]
    detail = await browser.http.get(started.headers["location"])
    assert 'data-testid="backfill-state">RUNNING<' in detail.text and "0 created, 0 handled of 3" in detail.text
    listing = await browser.http.get(f"/ui/jobs/{job_id}/backfills")
    backfill = started.headers["location"].split("?")[0]
    assert backfill in listing.text
    # Bad input: named, nothing written.
    bad = await browser.http.post(f"/ui/jobs/{job_id}/backfills", data={**sent, "to": "tomorrow", "dryRun": "yes"})
    assert bad.status_code == 422 and "<code>to</code>" in bad.text
    future = (NOW + timedelta(hours=2)).isoformat()
    bad = await browser.http.post(f"/ui/jobs/{job_id}/backfills", data={**sent, "to": future, "dryRun": "yes"})
    assert bad.status_code == 422 and "in the future" in bad.text
    # Another tenant sees none of it.
    other = Browser(api)
    await other.sign_in(token(api, "other"))
    assert (await other.http.get(backfill)).status_code == 404
    assert (await other.http.get(f"/ui/jobs/{job_id}/backfills")).status_code == 404
    other_csrf = csrf_of((await other.http.get("/ui/jobs")).text)
    refused = await other.http.post(f"{backfill}/cancel", data={"csrf": other_csrf, "confirm": "yes"})
    assert refused.status_code == 404
    cancelled = await browser.http.post(f"{backfill}/cancel", data={"csrf": sent["csrf"], "confirm": "yes"})
    assert cancelled.status_code == 303
    assert 'data-testid="backfill-state">CANCELLED<' in (await browser.http.get(backfill)).text
    assert await api.db.fetchval("SELECT count(*) FROM audit_log WHERE action LIKE '%backfill%'") >= 1


async def test_changes_are_pushed_as_server_sent_events(
    api: Api, browser: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "STREAM_SEC", 6.0)  # the in-process client reads a stream once it has ended
    monkeypatch.setattr(events, "CHECK_SEC", 0.2)
    page = await browser.http.get("/ui/jobs")
    assert "consolechanged from:body" in page.text and "data-feed" in page.text  # polling stays the fallback

    async def a_change_soon() -> None:
        await asyncio.sleep(2.5)  # the feed is live by then
        await a_job(api, name="pushed")

    task = asyncio.create_task(a_change_soon())
    stream = await browser.http.get("/ui/events", timeout=30)
    await task
    assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
    assert stream.headers["content-security-policy"] and stream.headers["cache-control"] == "no-store"
    names = re.findall(r"^event: (\w+)$", stream.text, re.M)
    assert names[:2] == ["live", "change"], stream.text
    # No session, no stream.
    assert (await Browser(api).http.get("/ui/events")).status_code == 303
    # A stopping process ends its streams at once: a graceful stop does not wait for open tabs.
    stopping = threading.Event()
    stopping.set()
    monkeypatch.setattr(events, "CLOSING", stopping)
    monkeypatch.setattr(events, "STREAM_SEC", 60.0)
    ended = await asyncio.wait_for(browser.http.get("/ui/events"), timeout=10)
    assert "event:" not in ended.text


SSO = {
    "console_sso_headers": ["X-Forwarded-Email", "X-Forwarded-User"],
    "console_sso_proxies": ["10.0.0.0/24"],
    "console_sso_identities": {
        "alice@example.com": TENANT,
        "@other.example": "other",
        "ops@example.com": f"admin:{TENANT}",
    },
}


@pytest.mark.parametrize("api", [SSO], indirect=True)
async def test_sso_identities_are_taken_only_from_the_trusted_proxy(api: Api) -> None:
    proxied = Browser(api, client=("10.0.0.5", 50000), scheme="https")
    signed_in = await proxied.http.get("/ui/sign-in", headers={"X-Forwarded-Email": "alice@example.com"})
    assert signed_in.status_code == 303 and signed_in.headers["location"] == "/ui/jobs", signed_in.text[:2000]
    page = await proxied.http.get("/ui/jobs", headers={"X-Forwarded-Email": "alice@example.com"})
    assert page.status_code == 200 and f">{TENANT}</strong>" in page.text and "/ui/cluster" not in page.text
    # A domain maps to its tenant; an admin identity gets the operator's pages.
    bob = Browser(api, client=("10.0.0.6", 50000), scheme="https")
    await bob.http.get("/ui/sign-in", headers={"X-Forwarded-User": "bob@Other.example"})
    assert ">other</strong>" in (await bob.http.get("/ui/jobs")).text
    ops = Browser(api, client=("10.0.0.7", 50000), scheme="https")
    await ops.http.get("/ui/sign-in", headers={"X-Forwarded-Email": "ops@example.com"})
    assert "/ui/cluster" in (await ops.http.get("/ui/jobs")).text  # the operator's pages are offered
    # The same header from any other peer is refused, never taken — loopback included.
    for peer in ("203.0.113.7", "127.0.0.1", "10.0.1.5"):
        stranger = Browser(api, client=(peer, 50000), scheme="https")
        refused = await stranger.http.get("/ui/sign-in", headers={"X-Forwarded-Email": "alice@example.com"})
        assert refused.status_code == 403 and "trusted only from the configured SSO proxies" in refused.text, peer
        assert (await stranger.http.get("/ui/jobs")).status_code == 303  # no session
    # An identity no tenant is mapped to may not sign in.
    unknown = await Browser(api, client=("10.0.0.8", 50000), scheme="https").http.get(
        "/ui/sign-in", headers={"X-Forwarded-Email": "mallory@elsewhere.example"}
    )
    assert unknown.status_code == 403 and "no tenant is mapped" in unknown.text
    # Someone else signed in at the proxy on the same browser: alice's session ends.
    switched = await proxied.http.get("/ui/jobs", headers={"X-Forwarded-Email": "eve@other.example"})
    assert switched.status_code == 303 and "session-ended" in switched.headers["location"]
    assert (await proxied.http.get("/ui/jobs")).status_code == 303


async def test_sso_is_off_by_default(api: Api) -> None:
    b = Browser(api)
    form = await b.http.get("/ui/sign-in", headers={"X-Forwarded-Email": "alice@example.com"})
    assert form.status_code == 200 and "Bearer token" in form.text  # the header means nothing
    assert (await b.http.get("/ui/jobs")).status_code == 303


async def test_the_dead_letters_are_re_driven_in_bulk_after_their_count_is_seen(api: Api, browser: Browser) -> None:
    job_id = await a_job(api)
    for minutes in (1, 2, 3):
        pool = "reports" if minutes == 3 else "demo"  # one outside the filter
        scheduled = NOW - timedelta(minutes=minutes)
        await insert_execution(
            api, job_id, scheduled, pool=pool, state="DEAD", attempt=3, max_attempts=3, finished_at=NOW
        )
    listing = await browser.http.get("/ui/dead-letters?pool=demo")
    assert 'data-testid="bulk-redrive"' in listing.text
    sent = {"csrf": csrf_of(listing.text), "pool": "demo", "handler": ""}
    preview = await browser.http.post("/ui/dead-letters/redrive", data=sent)
    assert preview.status_code == 200 and 'data-testid="bulk-count">2 dead letters match' in preview.text
    assert await api.db.fetchval("SELECT count(*) FROM bulk_operations") == 0  # counted, nothing created
    started = await browser.http.post("/ui/dead-letters/redrive", data={**sent, "confirm": "yes"})
    assert started.status_code == 303 and started.headers["location"].startswith("/ui/bulk/"), started.text[:2000]
    operation = started.headers["location"]
    detail = await browser.http.get(operation)
    assert 'data-testid="bulk-state">PREPARING<' in detail.text or 'data-testid="bulk-state">RUNNING<' in detail.text
    selected = await api.db.fetchval("SELECT filter FROM bulk_operations")
    assert "DEAD" in str(selected) and "demo" in str(selected)
    # Another tenant sees none of it; the owner cancels it.
    other = Browser(api)
    await other.sign_in(token(api, "other"))
    assert (await other.http.get(operation)).status_code == 404
    cancelled = await browser.http.post(f"{operation}/cancel", data={"csrf": sent["csrf"]})
    assert cancelled.status_code == 303
    assert 'data-testid="bulk-state">CANCELLED<' in (await browser.http.get(operation)).text
