"""The web console under ``/ui``: sign-in, the session's protections, tenant isolation and the actions.

In-process API on real Postgres and Redis (the ``api`` fixture of ``tests.support.api``), driven as a browser would
drive it with JavaScript off: plain GETs and urlencoded form POSTs, following the redirects by hand.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from datetime import timedelta

import httpx
import pytest
from sundial_api.console.guard import CONTENT_SECURITY_POLICY
from sundial_api.console.sessions import COOKIE, SIGN_IN_COOKIE
from sundial_common.broker.kafka import ensure_topics
from sundial_common.broker.messages import pool_topic
from sundial_common.security.auth import SymmetricKey

from tests.support.api import NOW, SECRET, TENANT, Api, api, insert_execution, one_shot
from tests.support.pools import admit
from tests.support.tenants import tenant_token

__all__ = ["api"]  # the fixture

_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    match = _CSRF.search(html)
    assert match, html[:2000]
    return match.group(1)


class Browser:
    """One browser's cookie jar against the in-process API (loopback unless ``client`` says otherwise)."""

    def __init__(self, api: Api, client: tuple[str, int] = ("127.0.0.1", 50000), scheme: str = "http") -> None:
        transport = httpx.ASGITransport(app=api.app, client=client)
        self.http = httpx.AsyncClient(transport=transport, base_url=f"{scheme}://api.test")

    async def sign_in(self, token: str) -> httpx.Response:
        form = await self.http.get("/ui/sign-in")
        return await self.http.post("/ui/sign-in", data={"csrf": csrf_of(form.text), "token": token})

    async def csrf(self) -> str:
        return csrf_of((await self.http.get("/ui/jobs")).text)

    async def aclose(self) -> None:
        await self.http.aclose()


def token(api: Api, tenant: str = TENANT) -> str:
    return tenant_token(api.settings.database_url, tenant, secret=SECRET)


@pytest.fixture
async def browser(api: Api) -> Browser:
    b = Browser(api)
    response = await b.sign_in(token(api))
    assert response.status_code == 303 and response.headers["location"] == "/ui/jobs", response.text
    return b


async def a_job(api: Api, tenant: str = TENANT, **overrides: object) -> str:
    response = await api.create(one_shot(**overrides), tenant=tenant)
    assert response.status_code == 201, response.text
    return str(response.json()["jobId"])


async def test_pages_need_a_session(api: Api) -> None:
    b = Browser(api)
    for path in ("/ui", "/ui/jobs", "/ui/dead-letters", "/ui/pools", f"/ui/jobs/{uuid.uuid4()}"):
        response = await b.http.get(path)
        assert response.status_code == 303 and response.headers["location"].startswith("/ui/sign-in"), path
    # htmx refreshing a live region after the session ended: the whole tab is sent to sign in.
    response = await b.http.get("/ui/jobs", headers={"HX-Request": "true"})
    assert response.headers["HX-Redirect"] == "/ui/sign-in"


async def test_sign_in_sets_a_strict_http_only_cookie_and_the_pages_carry_the_security_headers(api: Api) -> None:
    b = Browser(api)
    response = await b.sign_in(token(api))
    cookie = next(v for k, v in response.headers.multi_items() if k == "set-cookie" and v.startswith(COOKIE + "="))
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert {"httponly", "path", "samesite", "max-age"} <= attributes
    assert "samesite=strict" in cookie.lower() and "path=/ui" in cookie.lower()
    assert "secure" not in attributes  # plain HTTP on loopback; see the next test
    page = await b.http.get("/ui/jobs")
    assert page.status_code == 200
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "frame-ancestors 'none'" in CONTENT_SECURITY_POLICY and "unsafe-inline" not in CONTENT_SECURITY_POLICY
    assert page.headers["cache-control"] == "no-store"
    assert "<style" not in page.text and " style=" not in page.text  # the CSP would block them
    assert re.search(r"<script>|<script [^>]*>[^<]", page.text) is None  # no inline script either


async def test_outside_loopback_the_cookie_is_secure_and_there_is_no_dev_sign_in(api: Api) -> None:
    # Over HTTPS (as behind a TLS proxy): the browser would not send a Secure cookie back over plain HTTP.
    b = Browser(api, client=("203.0.113.7", 50000), scheme="https")
    form = await b.http.get("/ui/sign-in")
    assert "/ui/sign-in/dev" not in form.text
    refused = await b.http.post("/ui/sign-in/dev", data={"csrf": csrf_of(form.text)})
    assert refused.status_code == 403
    response = await b.sign_in(token(api))
    cookie = next(v for k, v in response.headers.multi_items() if k == "set-cookie" and v.startswith(COOKIE + "="))
    assert "secure" in cookie.lower()


async def test_one_click_dev_sign_in_on_loopback(api: Api) -> None:
    tenant_token(api.settings.database_url, api.settings.console_dev_tenant, secret=SECRET)
    b = Browser(api)
    form = await b.http.get("/ui/sign-in")
    assert "/ui/sign-in/dev" in form.text
    response = await b.http.post("/ui/sign-in/dev", data={"csrf": csrf_of(form.text)})
    assert response.status_code == 303, response.text
    page = await b.http.get("/ui/jobs")
    assert f">{api.settings.console_dev_tenant}</strong>" in page.text


async def test_sign_in_refuses_forged_tokens_and_cross_site_forms(api: Api) -> None:
    b = Browser(api)
    assert (await b.sign_in("not-a-jwt")).status_code == 401
    assert (await b.sign_in(tenant_token(api.settings.database_url, TENANT, secret="x" * 40))).status_code == 401
    # No form cookie (another site's page posting here): refused before the token is even read.
    other = Browser(api)
    response = await other.http.post("/ui/sign-in", data={"csrf": "guess", "token": token(api)})
    assert response.status_code == 403 and COOKIE not in response.cookies
    form = await other.http.get("/ui/sign-in")
    response = await other.http.post(
        "/ui/sign-in",
        data={"csrf": csrf_of(form.text), "token": token(api)},
        headers={"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
    )
    assert response.status_code == 403
    assert other.http.cookies.get(SIGN_IN_COOKIE)  # the form's own cookie only


async def test_the_session_cookie_never_authenticates_the_api(api: Api, browser: Browser) -> None:
    session = browser.http.cookies.get(COOKIE)
    assert session
    response = await browser.http.get("/v1/jobs", headers={"Cookie": f"{COOKIE}={session}"})
    assert response.status_code == 401


async def test_actions_need_the_csrf_token_and_write_the_apis_audit(api: Api, browser: Browser) -> None:
    job_id = await a_job(api, type="CRON", schedule="*/5 * * * *", timezone="Europe/Paris", runAt=None)
    refused = await browser.http.post(f"/ui/jobs/{job_id}/pause", data={})
    assert refused.status_code == 403
    refused = await browser.http.post(f"/ui/jobs/{job_id}/pause", data={"csrf": "wrong"})
    assert refused.status_code == 403
    assert await api.db.fetchval("SELECT state FROM jobs WHERE id = $1", uuid.UUID(job_id)) == "ACTIVE"
    csrf = await browser.csrf()
    paused = await browser.http.post(f"/ui/jobs/{job_id}/pause", data={"csrf": csrf})
    assert paused.status_code == 303 and paused.headers["location"] == f"/ui/jobs/{job_id}?notice=paused"
    page = await browser.http.get(paused.headers["location"])
    assert "Paused: no fires" in page.text and 'data-testid="job-state">PAUSED<' in page.text
    actor = await api.db.fetchval(
        "SELECT actor FROM audit_log WHERE entity_id = $1 AND action = 'pause'", uuid.UUID(job_id)
    )
    assert actor == f"{TENANT}-service"  # the token's subject, as the API records it
    resumed = await browser.http.post(f"/ui/jobs/{job_id}/resume", data={"csrf": csrf})
    assert resumed.status_code == 303
    assert await api.db.fetchval("SELECT state FROM jobs WHERE id = $1", uuid.UUID(job_id)) == "ACTIVE"
    # The job page shows its next 10 fires in its zone.
    page = await browser.http.get(f"/ui/jobs/{job_id}")
    assert "Next 10 fires (Europe/Paris)" in page.text
    cancelled = await browser.http.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": csrf, "confirm": "yes"})
    assert cancelled.status_code == 303
    assert await api.db.fetchval("SELECT state FROM jobs WHERE id = $1", uuid.UUID(job_id)) == "CANCELLED"
    page = await browser.http.get(f"/ui/jobs/{job_id}")
    assert (
        "Delete job" not in page.text and "/edit" not in page.text and "Pause" not in page.text
    )  # no action a cancelled job cannot take


async def test_a_tenant_sees_and_changes_only_its_own(api: Api, browser: Browser) -> None:
    mine = await a_job(api, name="mine-visible")
    theirs = await a_job(api, tenant="other", name="theirs-hidden")
    execution = await insert_execution(api, theirs, NOW, state="DEAD", tenant_id="other", error=None)
    listing = await browser.http.get("/ui/jobs")
    assert "mine-visible" in listing.text and "theirs-hidden" not in listing.text
    await a_job(api, name="labelled", labels={"team": "payments"})
    labelled = await browser.http.get("/ui/jobs", params={"label": "team:payments"})
    assert "labelled" in labelled.text and "mine-visible" not in labelled.text
    assert (await browser.http.get(f"/ui/jobs/{theirs}")).status_code == 404
    assert (await browser.http.get(f"/ui/executions/{execution}")).status_code == 404
    assert str(execution) not in (await browser.http.get("/ui/dead-letters")).text
    csrf = await browser.csrf()
    assert (await browser.http.get(f"/ui/jobs/{theirs}/edit")).status_code == 404
    for action in ("pause", "trigger", "cancel", "edit"):
        data = {"csrf": csrf, "confirm": "yes", "version": "1", "name": "taken-over", "pool": "demo", "handler": "x"}
        response = await browser.http.post(f"/ui/jobs/{theirs}/{action}", data=data)
        assert response.status_code == 404, action
    assert (await browser.http.post(f"/ui/executions/{execution}/retry", data={"csrf": csrf})).status_code == 404
    assert await api.db.fetchval("SELECT state FROM jobs WHERE id = $1", uuid.UUID(theirs)) == "ACTIVE"
    assert (await browser.http.get(f"/ui/jobs/{mine}")).status_code == 200


async def test_tenant_text_is_escaped(api: Api, browser: Browser) -> None:
    job_id = await a_job(api, name="<script>alert(1)</script>", payload={"html": "<img src=x onerror=alert(2)>"})
    for path in ("/ui/jobs", f"/ui/jobs/{job_id}"):
        page = await browser.http.get(path)
        assert "<script>alert(1)" not in page.text and "&lt;script&gt;alert(1)" in page.text
        assert "<img src=x" not in page.text


async def test_dead_letters_are_listed_and_re_driven(api: Api, browser: Browser) -> None:
    job_id = await a_job(api)
    dead = await insert_execution(
        api, job_id, NOW - timedelta(minutes=1), state="DEAD", attempt=3, max_attempts=3, finished_at=NOW
    )
    page = await browser.http.get("/ui/dead-letters")
    assert f"/ui/executions/{dead}" in page.text and "Re-drive" in page.text
    response = await browser.http.post(
        f"/ui/executions/{dead}/retry", data={"csrf": csrf_of(page.text), "from": "dead-letters"}
    )
    assert response.status_code == 303 and response.headers["location"] == "/ui/dead-letters?notice=retried"
    assert await api.db.fetchval("SELECT next_attempt_at IS NOT NULL FROM executions WHERE id = $1", dead)
    detail = await browser.http.get(f"/ui/executions/{dead}")
    assert detail.status_code == 200 and 'data-testid="fence-token">7<' in detail.text


async def test_bad_input_is_a_clear_4xx_page(api: Api, browser: Browser) -> None:
    for path, status in (
        ("/ui/jobs?state=BOGUS", 422),
        ("/ui/jobs?cursor=garbage", 422),
        ("/ui/jobs/not-a-uuid", 404),
        ("/ui/executions/12", 404),
        (f"/ui/jobs?q={'x' * 300}", 422),
        ("/ui/jobs?label=nocolon", 422),
    ):
        response = await browser.http.get(path)
        assert response.status_code == status, (path, response.text[:500])
        assert "text/html" in response.headers["content-type"]
    csrf = await browser.csrf()
    bad = await browser.http.post(
        "/ui/jobs/new", data={"csrf": csrf, "name": "x", "type": "CRON", "schedule": "61 * * * *",
                              "pool": "demo", "handler": "echo", "payload": "{"},
    )  # fmt: skip
    assert bad.status_code == 422 and "payload" in bad.text
    bad = await browser.http.post(
        "/ui/jobs/new", data={"csrf": csrf, "name": "x", "type": "CRON", "schedule": "61 * * * *",
                              "pool": "demo", "handler": "echo", "payload": "{}"},
    )  # fmt: skip
    assert bad.status_code == 422 and "schedule" in bad.text
    bad = await browser.http.post(
        "/ui/jobs/new", data={"csrf": csrf, "name": "a\x00b", "type": "DELAYED", "delaySeconds": "5",
                              "pool": "demo", "handler": "echo"},
    )  # fmt: skip
    assert bad.status_code == 422 and "cannot contain NUL" in bad.text
    assert await api.db.fetchval("SELECT count(*) FROM jobs WHERE name = 'x'") == 0


async def test_a_cron_job_created_through_the_form(api: Api, browser: Browser) -> None:
    csrf = await browser.csrf()
    response = await browser.http.post(
        "/ui/jobs/new", data={"csrf": csrf, "name": "nightly", "type": "CRON", "schedule": "30 2 * * *",
                              "timezone": "America/New_York", "pool": "demo", "handler": "echo",
                              "payload": '{"a": 1}', "maxAttempts": "2"},
    )  # fmt: skip
    assert response.status_code == 303, response.text
    page = await browser.http.get(response.headers["location"])
    assert "Job created." in page.text and "America/New_York" in page.text
    row = await api.db.fetchrow("SELECT timezone, schedule FROM jobs WHERE name = 'nightly'")
    assert dict(row) == {"timezone": "America/New_York", "schedule": "30 2 * * *"}


async def test_sign_out_ends_the_session_for_every_copy_of_the_cookie(api: Api, browser: Browser) -> None:
    stolen = browser.http.cookies.get(COOKIE)
    response = await browser.http.post("/ui/sign-out", data={"csrf": await browser.csrf()})
    assert response.status_code == 303
    replay = Browser(api)
    replay.http.cookies.set(COOKIE, str(stolen), domain="api.test", path="/ui")
    assert (await replay.http.get("/ui/jobs")).status_code == 303


@pytest.mark.parametrize("api", [{"tenant_cache_sec": 0}], indirect=True)
async def test_a_suspended_tenants_sessions_end(api: Api, browser: Browser) -> None:
    await api.db.execute("UPDATE tenants SET state = 'SUSPENDED' WHERE id = $1", TENANT)
    try:
        response = await browser.http.get("/ui/jobs")
        assert response.status_code == 303 and "session-ended" in response.headers["location"]
    finally:
        await api.db.execute("UPDATE tenants SET state = 'ACTIVE' WHERE id = $1", TENANT)


_SEEN = re.compile(r'"X-Console-Seen": "([^"]*)"')


async def test_a_live_region_is_answered_from_the_change_feed_until_the_tenant_changes(
    api: Api, browser: Browser
) -> None:
    async def seen() -> str:
        page = await browser.http.get("/ui/jobs")
        match = _SEEN.search(page.text)
        assert match, page.text[:3000]
        return match.group(1)

    async def refresh(version: str) -> httpx.Response:
        return await browser.http.get("/ui/jobs", headers={"HX-Request": "true", "X-Console-Seen": version})

    version = await seen()
    for _ in range(100):  # the feed's first poll, then the version it shows
        if version.split("@")[0] and (await refresh(version)).status_code == 204:
            break
        await asyncio.sleep(0.1)
        version = await seen()
    assert (await refresh(version)).status_code == 204  # nothing changed: nothing read, nothing sent
    # Another tenant's change is not this tenant's.
    await a_job(api, tenant="other", name="elsewhere")
    await asyncio.sleep(2.5)  # more than a poll of the feed
    assert (await refresh(version)).status_code == 204
    await a_job(api, name="fresh-one")
    for _ in range(50):
        response = await refresh(version)
        if response.status_code == 200:
            break
        await asyncio.sleep(0.1)
    assert response.status_code == 200 and "fresh-one" in response.text
    assert "<html" not in response.text  # only the live region


async def test_rotating_out_the_signing_key_ends_the_sessions_it_vouched_for(api: Api, browser: Browser) -> None:
    assert (await browser.http.get("/ui/jobs")).status_code == 200
    verifier = api.app.state.api.verifier
    kept = verifier.keys
    verifier.keys = (SymmetricKey("next", "a-new-signing-key-after-rotation-0123456789"),)
    try:
        response = await browser.http.get("/ui/jobs")
        assert response.status_code == 303 and "session-ended" in response.headers["location"]
    finally:
        verifier.keys = kept
    assert (await browser.http.get("/ui/jobs")).status_code == 303  # ended, not merely refused


@pytest.fixture
def broker_pool(monkeypatch: pytest.MonkeyPatch, kafka_bootstrap: str) -> str:
    """A pool of this test's own with its topic on the session's broker, which the API built after this uses
    (replays read the source topic's offsets)."""
    monkeypatch.setenv("SUNDIAL_KAFKA_BOOTSTRAP", kafka_bootstrap)
    pool = f"console-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [pool_topic(pool)])
    return pool


async def test_a_replay_starts_as_a_dry_run_and_can_be_cancelled(broker_pool: str, api: Api, browser: Browser) -> None:
    admit(api.settings.database_url, broker_pool, TENANT)
    admit(api.settings.database_url, f"staging-{broker_pool}", TENANT, kind="staging")
    csrf = await browser.csrf()
    start = (NOW - timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    end = (NOW - timedelta(minutes=1)).isoformat().replace("+00:00", "Z")
    form = {"csrf": csrf, "sourcePool": broker_pool, "targetPool": f"staging-{broker_pool}", "from": start, "to": end,
            "handler": "echo", "dryRun": "yes"}  # fmt: skip
    refused = await browser.http.post("/ui/replays", data={**form, "targetPool": broker_pool})
    assert refused.status_code in (403, 422) and "targetPool" in refused.text
    response = await browser.http.post("/ui/replays", data=form)
    assert response.status_code == 303, response.text[:2000]
    page = await browser.http.get(response.headers["location"])
    assert "(dry run)" in page.text and 'data-testid="replay-state">PENDING<' in page.text
    listing = await browser.http.get("/ui/replays")
    assert response.headers["location"].removeprefix("/ui/replays/") in listing.text
    cancelled = await browser.http.post(f"{response.headers['location']}/cancel", data={"csrf": csrf})
    assert cancelled.status_code == 303
    page = await browser.http.get(response.headers["location"])
    assert 'data-testid="replay-state">CANCELLED<' in page.text
    # Another tenant sees none of it.
    other = Browser(api)
    await other.sign_in(token(api, "other"))
    assert (await other.http.get(response.headers["location"])).status_code == 404


@pytest.fixture
def etcd_env(monkeypatch: pytest.MonkeyPatch, etcd_endpoint: str) -> None:
    """The session's etcd for the API built after this (the cluster view reads the leases there)."""
    monkeypatch.setenv("SUNDIAL_ETCD_ENDPOINT", etcd_endpoint)


async def test_operator_pages_are_for_admin_sessions_only(etcd_env: None, api: Api, browser: Browser) -> None:
    jobs = await browser.http.get("/ui/jobs")
    assert "/ui/cluster" not in jobs.text and "/ui/tenants" not in jobs.text
    for path in ("/ui/cluster", "/ui/tenants"):
        assert (await browser.http.get(path)).status_code == 403, path
    refused = await browser.http.post("/ui/tenants/other/suspend", data={"csrf": csrf_of(jobs.text), "confirm": "yes"})
    assert refused.status_code == 403

    admin = Browser(api)
    await admin.sign_in(tenant_token(api.settings.database_url, TENANT, secret=SECRET, admin=True))
    cluster = await admin.http.get("/ui/cluster")
    assert cluster.status_code == 200 and "Shards" in cluster.text and "/ui/tenants" in cluster.text
    listing = await admin.http.get("/ui/tenants")
    assert listing.status_code == 200 and ">other<" in listing.text.replace(" <small>", "<")
    csrf = csrf_of(listing.text)
    suspended = await admin.http.post("/ui/tenants/other/suspend", data={"csrf": csrf, "confirm": "yes"})
    assert suspended.status_code == 303
    assert await api.db.fetchval("SELECT state FROM tenants WHERE id = 'other'") == "SUSPENDED"
    resumed = await admin.http.post("/ui/tenants/other/resume", data={"csrf": csrf, "confirm": "yes"})
    assert resumed.status_code == 303
    assert await api.db.fetchval("SELECT state FROM tenants WHERE id = 'other'") == "ACTIVE"
    unconfirmed = await admin.http.post("/ui/tenants/other/suspend", data={"csrf": csrf})
    assert unconfirmed.status_code == 422
    assert (await admin.http.post("/ui/tenants/other/delete", data={"csrf": csrf, "confirm": "yes"})).status_code == 404


async def test_breakers_are_opened_and_closed_with_a_confirmation(api: Api, browser: Browser) -> None:
    mine = await api.db.fetchval(
        "INSERT INTO breakers (tenant_id, pool, handler) VALUES ($1, 'demo', 'send') RETURNING id", TENANT
    )
    theirs = await api.db.fetchval(
        "INSERT INTO breakers (tenant_id, pool, handler) VALUES ('other', 'demo', 'theirs') RETURNING id"
    )
    page = await browser.http.get("/ui/pools")
    assert f"/ui/breakers/{mine}/open" in page.text and str(theirs) not in page.text
    csrf = csrf_of(page.text)
    assert (await browser.http.post(f"/ui/breakers/{mine}/open", data={"csrf": csrf})).status_code == 422
    opened = await browser.http.post(f"/ui/breakers/{mine}/open", data={"csrf": csrf, "confirm": "yes"})
    assert opened.status_code == 303
    assert await api.db.fetchval("SELECT state FROM breakers WHERE id = $1", mine) == "OPEN"
    page = await browser.http.get("/ui/pools")
    assert 'data-testid="breaker-state">OPEN<' in page.text and f"/ui/breakers/{mine}/close" in page.text
    closed = await browser.http.post(f"/ui/breakers/{mine}/close", data={"csrf": csrf, "confirm": "yes"})
    assert closed.status_code == 303
    assert await api.db.fetchval("SELECT state FROM breakers WHERE id = $1", mine) == "CLOSED"
    refused = await browser.http.post(f"/ui/breakers/{theirs}/open", data={"csrf": csrf, "confirm": "yes"})
    assert refused.status_code == 404
    assert await api.db.fetchval("SELECT state FROM breakers WHERE id = $1", theirs) == "CLOSED"
