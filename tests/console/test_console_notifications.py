"""The console's notifications page and an HTTP pool's target, in a real browser against a real API process.

A tenant subscribes a webhook on 127.0.0.1 (a network the deployment allows) through the form, sees its secret
once and the subscription listed, sends a test and sees the delivery in the log, then deletes it; a bad URL shows
the API's message by the field. On the pools page, an HTTP pool the tenant owns shows its delivery and, once set
through the form, its target URL.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
from playwright.async_api import Browser, Page, expect

from tests.console.conftest import TENANT, Console
from tests.support.pools import admit
from tests.support.processes import Processes, free_port
from tests.support.tenants import tenant_token
from tests.support.webhook_receiver import WebhookReceiver, running_receiver

HTTP_POOL = "hooks"


@pytest.fixture
def api_only(processes: Processes, database_url: str) -> Console:
    """The API process alone (nothing here dispatches), allowed to send to loopback."""
    port = free_port()
    token = tenant_token(database_url, TENANT, pools=("demo",))
    admit(database_url, HTTP_POOL, TENANT)
    processes.start(
        "api", "api", "--host", "127.0.0.1", "--port", str(port),
        env={"SUNDIAL_DELIVERY_ALLOWED_NETWORKS": '["127.0.0.1/32"]'},
    )  # fmt: skip
    processes.wait_http_ok("api", f"http://127.0.0.1:{port}/readyz")
    admin_token = tenant_token(database_url, TENANT, admin=True)
    return Console(f"http://127.0.0.1:{port}", token, admin_token, database_url, processes)


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    async with running_receiver() as r:
        yield r


async def sign_in(page: Page, console: Console) -> None:
    await page.goto(f"{console.url}/ui/sign-in")
    await page.get_by_label(re.compile("Bearer token")).fill(console.token)
    await page.get_by_role("button", name="Sign in", exact=True).click()
    await expect(page.get_by_test_id("tenant")).to_have_text(TENANT)


async def subscribe_test_and_delete(page: Page, console: Console, receiver: WebhookReceiver) -> None:
    await page.get_by_role("link", name="Notifications").click()
    await page.get_by_label("Webhook URL").fill("ftp://nowhere")
    await page.get_by_role("button", name="Subscribe").click()
    await expect(page.get_by_test_id("field-error-url")).to_be_visible()  # the API's 422, by its field
    url = f"{receiver.url}/sundial"
    await page.get_by_label("Webhook URL").fill(url)
    await page.get_by_label("Description (optional)").fill("on-call hook")
    await page.get_by_role("button", name="Subscribe").click()
    await expect(page.get_by_test_id("subscription-secret")).to_have_text(re.compile(r"^whsec_"))
    row = page.locator("tr[data-subscription]")
    await expect(row).to_have_count(1)
    await expect(row).to_contain_text(url)
    await expect(row).to_contain_text("execution.dead")
    await console.screenshot(page, "20-notifications")
    await row.get_by_role("button", name="Test send").click()
    await expect(page.get_by_role("status")).to_have_text(re.compile("Test sent"))
    await expect(page.get_by_test_id("delivery-state").first).to_have_text("DELIVERED")
    assert [r.path for r in receiver.received] == ["/sundial"]
    await console.screenshot(page, "21-subscription-log")
    await page.get_by_role("button", name="Delete").click()
    await expect(page.get_by_role("status")).to_have_text(re.compile("Subscription deleted"))
    await expect(page.locator("tr[data-subscription]")).to_have_count(0)


async def see_an_http_pools_target(page: Page, console: Console, receiver: WebhookReceiver) -> None:
    async with httpx.AsyncClient(base_url=console.url) as api:
        changed = await api.patch(
            f"/v1/admin/pools/{HTTP_POOL}",
            json={"delivery": "http"},
            headers={"Authorization": f"Bearer {console.admin_token}"},
        )
    assert changed.status_code == 200, changed.text
    await page.get_by_role("navigation").get_by_role("link", name="Pools").click()
    section = page.locator(f"section[data-pool='{HTTP_POOL}']")
    await expect(section).to_contain_text("No target yet")
    await section.get_by_label(f"Target URL of {HTTP_POOL}").fill(f"{receiver.url}/jobs")
    await section.get_by_role("button", name="Set target").click()
    await expect(page.get_by_test_id("target-secret")).to_be_visible()  # a new secret, shown this once
    await page.get_by_role("navigation").get_by_role("link", name="Pools").click()
    await expect(page.locator(f"tr[data-pool='{HTTP_POOL}']").get_by_test_id("pool-delivery")).to_have_text("http")
    section = page.locator(f"section[data-pool='{HTTP_POOL}']")
    await expect(section.get_by_test_id("pool-target-url")).to_have_text(f"{receiver.url}/jobs")
    await console.screenshot(page, "22-pool-target")


@pytest.mark.e2e
async def test_a_tenant_manages_its_webhooks_and_sees_its_http_pools_target(
    api_only: Console, browser: Browser, receiver: WebhookReceiver
) -> None:
    context = await browser.new_context(viewport={"width": 1280, "height": 800}, locale="en-US")
    page = await context.new_page()
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    await sign_in(page, api_only)
    await subscribe_test_and_delete(page, api_only, receiver)
    await see_an_http_pools_target(page, api_only, receiver)
    await context.close()
    # No script error on any page (the one 422 is the refused URL's answer, which the browser logs).
    assert [e for e in errors if "status of 422" not in e] == [], errors
