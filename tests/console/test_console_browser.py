"""The console in a real browser, as a tenant uses it, against the real processes.

One story per stack (starting the processes is the slow part): a tenant signs in with its token, creates a
cron job in a time zone through the form, triggers it and watches the execution turn SUCCEEDED without a
reload, pauses and resumes it, edits it, counts a backfill with a dry run, reads a failed execution's error,
re-drives it from the dead letters, cancels a running one, counts a replay with a dry run, opens and closes a
breaker and sees the pool's live worker, sorts the jobs by next fire in the browser's own zone with changes
pushed live; then a second tenant (signed in with the one-click development sign-in) sees none of it, and an
operator sees the cluster and the tenants.
"""

from __future__ import annotations

import re

import asyncpg
import httpx
import pytest
from playwright.async_api import Browser, Page, expect

from tests.console.conftest import DEV_TENANT, TENANT, Console

#: Long enough for a dispatch, a handler run and the next refresh on a loaded two-core machine.
LIVE_TIMEOUT_MS = 30_000


async def create_job(console: Console, body: dict[str, object]) -> str:
    async with httpx.AsyncClient(base_url=console.url, headers={"Authorization": f"Bearer {console.token}"}) as api:
        response = await api.post("/v1/jobs", json={"target": {"pool": "demo", "handler": "echo"}, **body})
    assert response.status_code == 201, response.text
    return str(response.json()["jobId"])


async def mark_page(page: Page) -> None:
    """A marker on the window that a reload would lose: the live parts must refresh without one."""
    await page.evaluate("window.consoleTestMarker = 'still here'")


async def still_same_page(page: Page) -> None:
    assert await page.evaluate("window.consoleTestMarker") == "still here"


async def sign_in_with_token(page: Page, console: Console) -> None:
    await page.goto(f"{console.url}/ui/jobs")
    await expect(page).to_have_url(re.compile(r"/ui/sign-in$"))
    await console.screenshot(page, "01-sign-in")
    await page.get_by_label(re.compile("Bearer token")).fill(console.token)
    await page.get_by_role("button", name="Sign in", exact=True).click()
    await expect(page).to_have_url(re.compile(r"/ui/jobs$"))
    await expect(page.get_by_test_id("tenant")).to_have_text("acme")


async def create_cron_job_through_the_form(page: Page, console: Console) -> str:
    await page.get_by_role("link", name="New job").click()
    await page.get_by_label("Name", exact=True).fill("nightly-report <b>")
    await page.get_by_label("Type", exact=True).select_option("CRON")
    await page.get_by_label(re.compile("Cron expression")).fill("30 2 * * *")
    await page.get_by_label(re.compile("Time zone")).fill("America/New_York")
    await page.get_by_label("Pool", exact=True).fill("demo")
    await page.get_by_label("Handler", exact=True).fill("echo")
    await page.get_by_label(re.compile("Payload")).fill('{"report": "<script>alert(1)</script>"}')
    await console.screenshot(page, "02-new-job")
    await page.get_by_role("button", name="Create job").click()
    await expect(page.get_by_role("status")).to_have_text(re.compile("Job created"))
    await expect(page.get_by_role("heading", level=1)).to_have_text("nightly-report <b>")  # escaped, shown as text
    await expect(page.get_by_role("heading", name="Next 10 fires (America/New_York)")).to_be_visible()
    match = re.search(r"/ui/jobs/([0-9a-f-]{36})", page.url)
    assert match, page.url
    return match.group(1)


async def trigger_and_watch_it_succeed(page: Page, console: Console) -> None:
    await page.get_by_role("button", name="Trigger now").click()
    await expect(page.get_by_role("status")).to_have_text(re.compile("Triggered"))
    await mark_page(page)
    await expect(page.get_by_test_id("execution-state").first).to_have_text("SUCCEEDED", timeout=LIVE_TIMEOUT_MS)
    await still_same_page(page)
    await console.screenshot(page, "03-job")


async def pause_and_resume(page: Page) -> None:
    await page.get_by_role("button", name="Pause").click()
    await expect(page.get_by_test_id("job-state")).to_have_text("PAUSED")
    await page.get_by_role("button", name="Resume").click()
    await expect(page.get_by_test_id("job-state")).to_have_text("ACTIVE")


async def edit_it_and_count_a_backfill(page: Page, console: Console) -> None:
    """The job's edit form (saved with the version it was opened on), then a backfill's dry run from its page."""
    await page.get_by_role("link", name="Edit").click()
    await page.get_by_label(re.compile("Cron expression")).fill("45 3 * * *")
    await page.get_by_role("button", name="Save changes").click()
    await expect(page.get_by_role("status")).to_have_text(re.compile("Saved"))
    await expect(page.get_by_text("45 3 * * *", exact=True)).to_be_visible()
    await page.get_by_role("link", name="Backfills").click()
    await page.get_by_role("button", name="Start backfill").click()  # the form's defaults: a dry run, last day
    await expect(page.get_by_test_id("backfill-count")).to_have_text(re.compile(r"^\d+$"))
    await console.screenshot(page, "13-backfill-dry-run")
    await page.get_by_role("link", name="nightly-report <b>").click()


async def read_a_failure_and_re_drive_it(page: Page, console: Console) -> str:
    await create_job(
        console,
        {"name": "always-fails", "type": "DELAYED", "delaySeconds": 0, "retryPolicy": {"maxAttempts": 1},
         "target": {"pool": "demo", "handler": "fail"}},
    )  # fmt: skip
    await page.get_by_role("link", name="Dead letters").click()
    await mark_page(page)
    redrive = page.get_by_role("button", name=re.compile("Re-drive execution"))
    await expect(redrive).to_have_count(1, timeout=LIVE_TIMEOUT_MS)  # arrives live
    await still_same_page(page)
    await console.screenshot(page, "04-dead-letters")
    await page.get_by_role("table").get_by_role("link").first.click()
    await expect(page.get_by_test_id("execution-state")).to_have_text("DEAD")
    await expect(page.get_by_test_id("attempt-error").first).to_contain_text("demo failure")
    await console.screenshot(page, "05-execution-failed")
    execution_url = page.url
    await page.get_by_role("link", name="Dead letters").click()
    await page.get_by_role("button", name=re.compile("Re-drive execution")).click()
    await expect(page.get_by_role("status")).to_have_text(re.compile("Re-driven"))
    await page.goto(execution_url)
    await expect(page.get_by_role("heading", name=re.compile("Attempt 2"))).to_be_visible(timeout=LIVE_TIMEOUT_MS)
    return execution_url


async def cancel_a_running_execution(page: Page, console: Console) -> None:
    job_id = await create_job(
        console, {"name": "long-sleep", "type": "DELAYED", "delaySeconds": 0, "payload": {"seconds": 120},
                  "target": {"pool": "demo", "handler": "sleep"}},
    )  # fmt: skip
    await page.goto(f"{console.url}/ui/jobs/{job_id}")
    await expect(page.get_by_test_id("execution-state").first).to_have_text("RUNNING", timeout=LIVE_TIMEOUT_MS)
    await page.get_by_test_id("execution-state").first.locator("xpath=ancestor::tr").get_by_role("link").click()
    await page.get_by_role("button", name="Cancel").click()
    await expect(page.get_by_role("status")).to_have_text(re.compile("Cancel requested"))
    await expect(page.get_by_test_id("execution-state")).to_have_text("CANCELLED", timeout=LIVE_TIMEOUT_MS)
    await console.screenshot(page, "06-execution-cancelled")


async def count_a_replay_before_running_it(page: Page, console: Console) -> None:
    """A dry run over the last hour of the demo pool's messages (the runs above): counted, nothing published."""
    await page.get_by_role("link", name="Replays").click()
    await page.get_by_role("button", name="Start replay").click()  # the form's defaults: a dry run, last hour
    await expect(page.get_by_role("heading", level=1)).to_contain_text("(dry run)")
    await expect(page.get_by_test_id("replay-state")).to_have_text("SUCCEEDED", timeout=LIVE_TIMEOUT_MS)
    matched = int(await page.get_by_test_id("replay-matched").inner_text())
    assert matched >= 3  # the triggered run, the failed one's two attempts, the cancelled sleep
    await expect(page.get_by_role("button", name="Replay for real")).to_be_visible()
    await console.screenshot(page, "09-replay-dry-run")


async def a_second_tenant_sees_none_of_it(browser: Browser, console: Console, job_id: str, execution_url: str) -> None:
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    await page.goto(f"{console.url}/ui/sign-in")
    await page.get_by_role("button", name=f"Sign in as tenant {DEV_TENANT}").click()
    await expect(page.get_by_test_id("tenant")).to_have_text(DEV_TENANT)
    await expect(page.get_by_role("cell", name="No jobs match.")).to_be_visible()
    await console.screenshot(page, "08-second-tenant")
    for url in (f"{console.url}/ui/jobs/{job_id}", execution_url):
        response = await page.goto(url)
        assert response is not None and response.status == 404, url
    await page.goto(f"{console.url}/ui/dead-letters")
    await expect(page.get_by_role("cell", name="No dead letters.")).to_be_visible()
    await page.goto(f"{console.url}/ui/replays")
    await expect(page.get_by_role("cell", name="No replays.")).to_be_visible()
    await context.close()


async def open_and_close_a_breaker(page: Page, console: Console) -> None:
    """A breaker as the retry path creates one for a handler (its counts start at the first retried failure)."""
    conn = await asyncpg.connect(console.database_url)
    try:
        await conn.execute("INSERT INTO breakers (tenant_id, pool, handler) VALUES ($1, 'demo', 'flaky')", TENANT)
    finally:
        await conn.close()
    await page.get_by_role("link", name="Pools").click()
    await expect(page.get_by_test_id("breaker-state")).to_have_text("CLOSED")
    await page.get_by_label("sure").check()
    async with page.expect_response(lambda r: r.request.headers.get("hx-request") == "true" and "/ui/pools" in r.url):
        pass  # a live refresh of the page …
    await page.wait_for_function("() => document.querySelector('.htmx-request') === null")  # swapped in
    await expect(page.get_by_label("sure")).to_be_checked()  # … keeps the box the viewer ticked
    await page.get_by_role("button", name="Open breaker").click()
    await expect(page.get_by_role("status")).to_have_text(re.compile("Breaker opened"))
    await expect(page.get_by_test_id("breaker-state")).to_have_text("OPEN")
    await console.screenshot(page, "07-pools")
    await page.get_by_label("sure").check()
    await page.get_by_role("button", name="Close breaker").click()
    await expect(page.get_by_test_id("breaker-state")).to_have_text("CLOSED")
    # The demo worker announces itself in its pool.
    demo = page.locator('tr[data-pool="demo"]')
    await expect(demo.get_by_test_id("pool-live-workers")).to_have_text(re.compile(r"^[1-9]"))
    await expect(demo).to_contain_text("echo")


async def sort_by_next_fire_in_the_browsers_zone(page: Page, console: Console) -> None:
    """The context's zone is Asia/Tokyo: "my browser's zone" shows the next fire there, rewritten by the page."""
    await page.get_by_label("Sort").select_option("next-fire")
    await page.get_by_label("Times in").select_option("local")
    await page.get_by_role("button", name="Filter").click()
    await expect(page.get_by_role("link", name="nightly-report <b>")).to_be_visible()
    await expect(page.get_by_test_id("next-fire").first).to_contain_text("GMT+9")
    await expect(page.get_by_test_id("live-push")).to_be_visible()  # changes pushed by the server, not polled


async def an_operator_sees_the_cluster_and_the_tenants(browser: Browser, console: Console) -> None:
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    await page.goto(f"{console.url}/ui/sign-in")
    await page.get_by_label(re.compile("Bearer token")).fill(console.admin_token)
    await page.get_by_role("button", name="Sign in", exact=True).click()
    await page.get_by_role("link", name="Cluster").click()
    await expect(page.get_by_role("heading", name="Shards")).to_be_visible()
    await expect(page.get_by_role("cell", name=re.compile("^dispatcher")).first).to_be_visible()
    await console.screenshot(page, "10-cluster")
    await page.get_by_role("link", name="Tenants").click()
    await expect(page.get_by_test_id("tenant-state").first).to_have_text("ACTIVE")
    await console.screenshot(page, "11-tenants")
    await context.close()


@pytest.mark.e2e
async def test_a_tenant_runs_its_jobs_from_the_console_and_another_sees_none(
    console: Console, browser: Browser
) -> None:
    context = await browser.new_context(
        viewport={"width": 1280, "height": 800}, timezone_id="Asia/Tokyo", locale="en-US"
    )
    page = await context.new_page()
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    await sign_in_with_token(page, console)
    job_id = await create_cron_job_through_the_form(page, console)
    await trigger_and_watch_it_succeed(page, console)
    await pause_and_resume(page)
    await edit_it_and_count_a_backfill(page, console)
    execution_url = await read_a_failure_and_re_drive_it(page, console)
    await cancel_a_running_execution(page, console)
    await count_a_replay_before_running_it(page, console)
    await open_and_close_a_breaker(page, console)
    await page.get_by_role("link", name="Jobs", exact=True).click()
    await expect(page.get_by_role("link", name="nightly-report <b>")).to_be_visible()
    await sort_by_next_fire_in_the_browsers_zone(page, console)
    await console.screenshot(page, "00-jobs")
    await page.set_viewport_size({"width": 390, "height": 844})  # a phone
    assert await page.evaluate("document.documentElement.scrollWidth") <= 390  # nothing wider than the screen
    await console.screenshot(page, "12-jobs-phone")
    await page.set_viewport_size({"width": 1280, "height": 800})
    await page.get_by_role("button", name="Sign out").click()
    await expect(page).to_have_url(re.compile(r"/ui/sign-in\?notice=signed-out$"))
    await context.close()
    # No Content-Security-Policy violation and no script error on any page.
    assert errors == [], errors
    await a_second_tenant_sees_none_of_it(browser, console, job_id, execution_url)
    await an_operator_sees_the_cluster_and_the_tenants(browser, console)
