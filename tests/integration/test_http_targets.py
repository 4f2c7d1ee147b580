"""HTTP target pools: the owner sets the target over the API, and a delivery worker POSTs each execution to a real
HTTPS receiver on 127.0.0.1 (a local CA from ``trustme``), turning every kind of answer into the attempt's outcome:
2xx / 4xx / 5xx / a timeout / 429 with Retry-After / 202 then a completion through the API."""

from __future__ import annotations

import ssl
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx
import orjson
import pytest
import trustme
from redis.asyncio import Redis
from standardwebhooks import Webhook
from sundial_api.app import create_app
from sundial_api.settings import ApiSettings
from sundial_common.broker.kafka import KafkaPublisher
from sundial_common.hotwindow.execution_signals import heartbeat_key
from sundial_common.runtime.settings import DeliverySettings
from sundial_common.security.auth import issue_token
from sundial_common.stores import Stores
from sundial_worker.http_target import TargetDelivery, delivery_worker
from sundial_worker.settings import WorkerSettings

from tests.support.pools import admit
from tests.support.tenants import tenant_token
from tests.support.webhook_receiver import Reply, WebhookReceiver, running_receiver
from tests.support.worker import TENANT, dispatch, execution, publish, serving, settings, wait_state, wait_until

__all__ = ["settings"]  # the fixture

SECRET = "http-targets-test-secret-0123456789abcd"
LOOPBACK = ["127.0.0.0/8"]
POLICY = {"maxAttempts": 3, "backoff": "FIXED", "initialDelayMs": 1000, "jitter": False}

ApiFactory = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def api(database_url: str, redis_url: str, kafka_bootstrap: str) -> ApiFactory:
    """An in-process API; ``allowed`` is SUNDIAL_DELIVERY_ALLOWED_NETWORKS, ``ca`` SUNDIAL_DELIVERY_CA_BUNDLE."""

    @asynccontextmanager
    async def running(allowed: list[str] | None = None, ca: str | None = None) -> AsyncIterator[httpx.AsyncClient]:
        settings = ApiSettings(
            database_url=database_url,
            redis_url=redis_url,
            kafka_bootstrap=kafka_bootstrap,
            jwt_secret=SECRET,
            shards=2,
            delivery_allowed_networks=allowed or [],
            delivery_ca_bundle=ca,
        )
        app = create_app(settings)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api.test") as http,
        ):
            yield http

    return running


@pytest.fixture(scope="module")
def local_ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[trustme.CA, Path]:
    ca = trustme.CA()
    bundle = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    return ca, bundle


@pytest.fixture
async def https_receiver(local_ca: tuple[trustme.CA, Path]) -> AsyncIterator[WebhookReceiver]:
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    local_ca[0].issue_cert("127.0.0.1").configure_cert(tls)
    async with running_receiver(tls) as receiver:
        yield receiver


@pytest.fixture
def http_pool(database_url: str) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    admit(database_url, name, TENANT)
    return name


def owner(database_url: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tenant_token(database_url, TENANT, secret=SECRET)}"}


def admin(database_url: str) -> dict[str, str]:
    tenant_token(database_url, "ops", secret=SECRET)
    return {"Authorization": f"Bearer {issue_token(SECRET, 'ops', admin=True, subject='ops-alice')}"}


async def make_http(http: httpx.AsyncClient, database_url: str, pool: str) -> None:
    changed = await http.patch(f"/v1/admin/pools/{pool}", json={"delivery": "http"}, headers=admin(database_url))
    assert changed.status_code == 200 and changed.json()["delivery"] == "http", changed.text


async def test_the_owner_sets_a_target_refused_until_an_admin_allows_its_address(
    api: ApiFactory, database_url: str, http_pool: str, https_receiver: WebhookReceiver
) -> None:
    url = https_receiver.url + "/jobs"
    headers = owner(database_url)
    async with api() as http:
        not_http = await http.put(f"/v1/pools/{http_pool}/target", json={"url": url}, headers=headers)
        assert not_http.status_code == 409 and "delivery" in not_http.json()["detail"], not_http.text
        await make_http(http, database_url, http_pool)
        refused = await http.put(f"/v1/pools/{http_pool}/target", json={"url": url}, headers=headers)
        assert refused.status_code == 422, refused.text
        assert refused.json()["errors"][0]["field"] == "url" and "loopback" in refused.json()["detail"]
        assert https_receiver.received == []  # the check resolved and refused; nothing was sent
    async with api(allowed=LOOPBACK) as http:
        bad_path = await http.put(
            f"/v1/pools/{http_pool}/target", json={"url": url, "paths": {"send": "../admin"}}, headers=headers
        )
        assert bad_path.status_code == 422 and bad_path.json()["errors"][0]["field"] == "paths.send", bad_path.text
        made = await http.put(
            f"/v1/pools/{http_pool}/target", json={"url": url, "paths": {"send": "send"}}, headers=headers
        )
        assert made.status_code == 201 and made.headers["Cache-Control"] == "no-store", made.text
        secret = made.json()["secret"]
        assert secret.startswith("whsec_") and len(secret) > 40
        shown = await http.get(f"/v1/pools/{http_pool}/target", headers=headers)
        assert shown.json()["secret"] == f"whsec_…{secret[-4:]}" and shown.json()["paths"] == {"send": "send"}
        kept = await http.put(f"/v1/pools/{http_pool}/target", json={"url": url + "/v2"}, headers=headers)
        assert kept.status_code == 200 and kept.json()["secret"] == shown.json()["secret"]  # same secret, redacted
        stranger = await http.get(f"/v1/pools/{http_pool}/target", headers=owner_of(database_url, "globex"))
        assert stranger.status_code == 403


def owner_of(database_url: str, tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tenant_token(database_url, tenant, secret=SECRET)}"}


async def test_every_answer_becomes_the_attempts_outcome(
    api: ApiFactory,
    database_url: str,
    stores: Stores,
    publisher: KafkaPublisher,
    settings: WorkerSettings,
    http_pool: str,
    https_receiver: WebhookReceiver,
    local_ca: tuple[trustme.CA, Path],
    redis_url: str,
) -> None:
    receiver = https_receiver
    async with api(allowed=LOOPBACK) as http:
        await make_http(http, database_url, http_pool)
        paths = {h: h for h in ("ok", "bad", "down", "busy", "slow", "later")}
        made = await http.put(
            f"/v1/pools/{http_pool}/target",
            json={"url": receiver.url + "/t", "paths": paths},
            headers=owner(database_url),
        )
        assert made.status_code == 201, made.text
        secret = made.json()["secret"]
        receiver.routes = {
            "/t/ok": [Reply(200, b'{"sent": 3}')],
            "/t/bad": [Reply(400, b"no such list")],
            "/t/down": [Reply(503, b"maintenance")],
            "/t/busy": [Reply(429, headers={"retry-after": "120"})],
            "/t/slow": [Reply(200, delay_sec=5)],
            "/t/later": [Reply(202)],
        }
        delivery = DeliverySettings(delivery_allowed_networks=LOOPBACK, delivery_ca_bundle=str(local_ca[1]))
        target = TargetDelivery(settings, delivery, completion_base_url="http://api.test", hold_sec=60)
        messages = {}
        for handler in paths:
            [messages[handler]] = await dispatch(
                stores,
                http_pool,
                handler,
                [{"to": handler}],
                timeout_sec=1 if handler == "slow" else 30,
                retry_policy=POLICY,
            )
        try:
            async with serving(delivery_worker(http_pool, target, concurrency=8), settings):
                started = datetime.now(UTC)
                await publish(publisher, list(messages.values()))
                ok = await wait_state(stores, messages["ok"], "SUCCEEDED")
                assert ok["result"] == {"sent": 3}
                bad = await wait_state(stores, messages["bad"], "DEAD")  # a 4xx: no retry, attempts left or not
                assert bad["attempt"] == 1 and "TargetHTTP400" in bad["error"] and "no such list" in bad["error"]
                down = await wait_state(stores, messages["down"], "FAILED")  # a 5xx: retried by the policy
                assert down["next_attempt_at"] is not None and "TargetHTTP503" in down["error"]
                busy = await wait_state(stores, messages["busy"], "FAILED")  # 429: after Retry-After, not 1 s
                assert (busy["next_attempt_at"] - started).total_seconds() > 100
                slow = await wait_state(stores, messages["slow"], "TIMED_OUT")  # the job's timeoutSec bounds it
                assert slow["next_attempt_at"] is not None

                async def accepted() -> bool:
                    return any(r.path == "/t/later" for r in receiver.received)

                await wait_until(accepted, "the 202 target to be called")
                [call] = [r for r in receiver.received if r.path == "/t/later"]
                body = orjson.loads(call.body)
                redis = Redis.from_url(redis_url)
                try:

                    async def held() -> bool:
                        return 10 < await redis.pttl(heartbeat_key(body["executionId"])) / 1000 <= 30

                    await wait_until(held, "the accepted attempt's liveness to be held for the job's timeout")
                finally:
                    await redis.aclose()
                assert (await execution(stores, messages["later"]))["state"] == "RUNNING"
        finally:
            await target.close()

        # What the target got: signed, with the execution's identity, and an idempotency key per attempt.
        assert Webhook(secret).verify(call.body, call.headers)["payload"] == {"to": "later"}
        assert call.headers["idempotency-key"] == f"{body['executionId']}:1" == call.headers["webhook-id"]
        assert body["attempt"] == 1 and body["fenceToken"] == 1 and body["handler"] == "later"
        assert body["scheduledFor"] and body["jobId"] == messages["later"].job_id

        # The 202's completion: its token completes its own attempt once.
        completion = body["completionUrl"].removeprefix("http://api.test")
        wrong = await http.post(completion, json={"outcome": "succeeded"}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        token = {"Authorization": f"Bearer {body['completionToken']}"}
        done = await http.post(completion, json={"outcome": "succeeded", "result": {"rows": 7}}, headers=token)
        assert done.status_code == 204, done.text
        later = await execution(stores, messages["later"])
        assert later["state"] == "SUCCEEDED" and later["result"] == {"rows": 7}
        again = await http.post(completion, json={"outcome": "failed"}, headers=token)
        assert again.status_code == 409
