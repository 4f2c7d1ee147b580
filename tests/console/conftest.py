"""The console's browser suite: real Sundial processes (api, hydrator, dispatcher, worker, replayer) and
Debian's chromium driven by Playwright.

Chromium is launched so that it never leaves loopback (every host name but 127.0.0.1 resolves to nothing,
no background networking, no component updates); Playwright's own browser download is never used.
Screenshots of each view go to ``.sundial/test-artifacts/console/``.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright

from tests.e2e.conftest import processes
from tests.support.pools import admit
from tests.support.processes import Processes, free_port
from tests.support.tenants import tenant_token

__all__ = ["processes"]  # the fixture, re-exported for this directory

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",  # the tests run as root
    "--disable-background-networking",
    "--disable-component-update",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / ".sundial" / "test-artifacts" / "console"
TENANT = "acme"
#: The tenant the one-click development sign-in opens (the API's default ``console_dev_tenant``).
DEV_TENANT = "demo"


@dataclass
class Console:
    """The running stack as the browser suite sees it."""

    url: str
    token: str
    admin_token: str
    database_url: str
    processes: Processes

    async def screenshot(self, page: Page, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


@pytest.fixture
def console(processes: Processes, database_url: str) -> Console:
    port = free_port()
    token = tenant_token(database_url, TENANT, pools=("demo",))
    tenant_token(database_url, DEV_TENANT, pools=("demo",))
    admit(database_url, "staging-demo", TENANT, kind="staging")  # where the tenant's replays go
    # Breakers and the console's live parts at their defaults; the worker polls cancel flags every second.
    processes.start("api", "api", "--host", "127.0.0.1", "--port", str(port))
    processes.start("hydrator", "hydrator")
    processes.start("dispatcher", "dispatcher")
    processes.start("worker", "worker", "--app", "sundial_worker.demo:worker", "--concurrency", "8")
    processes.start("replayer", "replayer")
    processes.wait_http_ok("api", f"http://127.0.0.1:{port}/readyz")
    processes.wait_for_log("dispatcher", "leading with fence token")
    processes.wait_for_log("worker", "partitions assigned")
    admin_token = tenant_token(database_url, TENANT, admin=True)
    return Console(f"http://127.0.0.1:{port}", token, admin_token, database_url, processes)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if shutil.which(CHROMIUM) is None:
        pytest.fail("Debian's chromium is not installed: `make test-deps` installs it")
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()
