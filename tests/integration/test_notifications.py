"""Notification subscriptions end to end in process: the API, the sweeper's incidents, the API's deliveries,
and a real receiver on 127.0.0.1 that checks every signature with the Standard Webhooks reference library."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError
from sundial_api.notification_delivery import NotificationDelivery
from sundial_common.broker.kafka import KafkaPublisher, ensure_topics
from sundial_common.broker.messages import DLQ_TOPIC, pool_topic
from sundial_common.domain.ids import new_id
from sundial_common.hotwindow.window import HotWindow
from sundial_common.stores import Stores
from sundial_common.stores.breakers import Transition
from sundial_sweeper.breakers import BreakerLoop, BreakerLoopConfig
from sundial_sweeper.incidents import (
    IncidentRetention,
    IncidentRetentionConfig,
    LateStarts,
    LateStartsConfig,
    LateStartsPass,
    OutcomeChanges,
    OutcomeChangesConfig,
    dead_incidents,
)
from sundial_sweeper.sweeper import Sweeper, SweeperConfig

from tests.integration.test_breakers import RETRY, SETTINGS, fail_attempts
from tests.integration.test_reliability import make_executions
from tests.support.api import SECRET, TENANT, Api, api  # noqa: F401  (the `api` fixture)
from tests.support.pools import admit
from tests.support.tenants import tenant_token
from tests.support.webhook_receiver import Reply, WebhookReceiver, running_receiver
from tests.support.worker import wait_until

SUBSCRIPTIONS = "/v1/notifications/subscriptions"
LOOPBACK_ALLOWED = [{"delivery_allowed_networks": ["127.0.0.1/32"]}]


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    async with running_receiver() as r:
        yield r


def deliveries_of(stack: Api) -> NotificationDelivery:
    delivery: NotificationDelivery = stack.app.state.api.notifications
    return delivery


async def subscribe(stack: Api, url: str, **fields: Any) -> dict[str, Any]:
    response = await stack.client.post(
        SUBSCRIPTIONS, json={"url": url, "events": ["execution.dead"], **fields}, headers=stack.auth()
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_bad_subscriptions_are_refused_naming_the_field(
    api: Api,  # noqa: F811
    receiver: WebhookReceiver,
) -> None:
    cases = [
        ({"url": receiver.url, "events": ["execution.dead"]}, "url", "127.0.0.1 is loopback"),
        ({"url": "http://169.254.169.254/latest", "events": ["execution.dead"]}, "url", "metadata"),
        ({"url": "ftp://hooks.example/x", "events": ["execution.dead"]}, "url", "https://"),
        ({"url": "https://hooks.example/x", "events": ["execution.deadd"]}, "events", "unknown event"),
        ({"url": "https://hooks.example/x", "events": []}, "events", ""),
        (
            {"url": "https://hooks.example/x", "events": ["execution.dead"], "jobId": str(uuid.uuid4())},
            "jobId",
            "no job",
        ),
    ]
    for body, field, words in cases:
        response = await api.client.post(SUBSCRIPTIONS, json=body, headers=api.auth())
        assert response.status_code == 422, (body, response.text)
        errors = response.json()["errors"]
        assert [e["field"] for e in errors] == [field], errors
        assert words in errors[0]["message"], errors
    assert receiver.received == []
    assert (await api.client.get(SUBSCRIPTIONS, headers=api.auth())).json() == {"items": []}


async def test_an_admin_allows_one_tenant_one_destination_until_withdrawn(
    api: Api,  # noqa: F811
    receiver: WebhookReceiver,
) -> None:
    destinations = "/v1/admin/notification-destinations"
    admin = {"Authorization": f"Bearer {tenant_token(api.settings.database_url, 'ops', admin=True, secret=SECRET)}"}
    body = {"url": receiver.url + "/hooks", "events": ["execution.dead"]}
    refused = await api.client.post(SUBSCRIPTIONS, json=body, headers=api.auth())
    assert refused.status_code == 422 and "loopback" in refused.text  # no network allowed to anyone
    allowance = {"tenant": TENANT, "url": receiver.url + "/anything"}
    assert (await api.client.post(destinations, json=allowance, headers=api.auth())).status_code == 403
    bad = await api.client.post(destinations, json={**allowance, "tenant": "nobody-here"}, headers=admin)
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "tenant"
    allowed = await api.client.post(destinations, json=allowance, headers=admin)
    assert allowed.status_code == 201, allowed.text
    assert (allowed.json()["origin"], allowed.json()["addresses"]) == (
        f"http://127.0.0.1:{receiver.port}",
        ["127.0.0.1"],
    )

    made = await api.client.post(SUBSCRIPTIONS, json=body, headers=api.auth())
    assert made.status_code == 201, made.text
    # Another tenant, or another port of the same host, gains nothing.
    assert (await api.client.post(SUBSCRIPTIONS, json=body, headers=api.auth("other"))).status_code == 422
    other_port = {**body, "url": f"http://127.0.0.1:{receiver.port + 1}/hooks"}
    assert (await api.client.post(SUBSCRIPTIONS, json=other_port, headers=api.auth())).status_code == 422
    sent = await api.client.post(f"{SUBSCRIPTIONS}/{made.json()['id']}/test", headers=api.auth())
    assert sent.json()["delivered"], sent.text

    revoked = await api.client.delete(destinations, params={"tenant": TENANT, "url": receiver.url}, headers=admin)
    assert revoked.status_code == 204
    again = await api.client.post(f"{SUBSCRIPTIONS}/{made.json()['id']}/test", headers=api.auth())
    assert not again.json()["delivered"] and "loopback" in again.json()["error"]
    assert len(receiver.received) == 1
    listed = await api.client.get(destinations, headers=admin)
    assert listed.json() == {"items": []}


@pytest.mark.parametrize("api", LOOPBACK_ALLOWED, indirect=True)
async def test_a_test_send_is_signed_and_logged_and_the_secret_is_shown_once(
    api: Api,  # noqa: F811
    receiver: WebhookReceiver,
) -> None:
    created = await subscribe(api, receiver.url + "/hooks?team=ops", description="on-call")
    secret = created["secret"]
    assert secret.startswith("whsec_") and len(secret) > 40
    listed = (await api.client.get(SUBSCRIPTIONS, headers=api.auth())).json()["items"]
    assert [s["id"] for s in listed] == [created["id"]]
    assert listed[0]["secret"] == f"whsec_…{secret[-4:]}"
    assert (await api.client.get(SUBSCRIPTIONS, headers=api.auth("other"))).json() == {"items": []}

    sent = await api.client.post(f"{SUBSCRIPTIONS}/{created['id']}/test", headers=api.auth())
    assert sent.status_code == 200 and sent.json()["delivered"] and sent.json()["status"] == 200
    [got] = receiver.received
    assert got.path == "/hooks?team=ops"
    assert Webhook(secret).verify(got.body, got.headers)["type"] == "test"
    assert got.headers["webhook-id"] == f"msg_{sent.json()['deliveryId']}"

    log = (await api.client.get(f"{SUBSCRIPTIONS}/{created['id']}/deliveries", headers=api.auth())).json()["items"]
    assert [(d["event"], d["state"], d["attempts"], d["lastStatus"]) for d in log] == [("test", "DELIVERED", 1, 200)]
    assert secret not in str(log)

    other = await api.client.get(f"{SUBSCRIPTIONS}/{created['id']}/deliveries", headers=api.auth("other"))
    assert other.status_code == 404
    assert (await api.client.delete(f"{SUBSCRIPTIONS}/{created['id']}", headers=api.auth())).status_code == 204
    assert (await api.client.get(f"{SUBSCRIPTIONS}/{created['id']}", headers=api.auth())).status_code == 404


@pytest.mark.parametrize("api", LOOPBACK_ALLOWED, indirect=True)
async def test_a_rotated_secret_signs_beside_the_previous_one_until_the_overlap_ends(
    api: Api,  # noqa: F811
    receiver: WebhookReceiver,
) -> None:
    created = await subscribe(api, receiver.url)
    old = created["secret"]
    path = f"{SUBSCRIPTIONS}/{created['id']}"
    rotated = await api.client.post(f"{path}/rotate-secret", headers=api.auth())
    assert rotated.status_code == 200 and rotated.json()["id"] == created["id"]
    new = rotated.json()["secret"]
    assert new.startswith("whsec_") and new != old
    assert (await api.client.get(path, headers=api.auth())).json()["secret"] == f"whsec_…{new[-4:]}"

    assert (await api.client.post(f"{path}/test", headers=api.auth())).json()["delivered"]
    during = receiver.received[-1]
    for secret in (old, new):  # a receiver that has not switched yet still accepts it
        Webhook(secret).verify(during.body, during.headers)

    stopped = await api.client.post(f"{path}/rotate-secret?previousValidSec=0", headers=api.auth())
    newest = stopped.json()["secret"]
    assert (await api.client.post(f"{path}/test", headers=api.auth())).json()["delivered"]
    after = receiver.received[-1]
    Webhook(newest).verify(after.body, after.headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new).verify(after.body, after.headers)
    bad = await api.client.post(f"{path}/rotate-secret?previousValidSec=-1", headers=api.auth())
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "previousValidSec"


@pytest.mark.parametrize("api", LOOPBACK_ALLOWED, indirect=True)
async def test_a_dead_execution_is_one_incident_delivered_until_acknowledged_under_one_webhook_id(
    api: Api,  # noqa: F811
    receiver: WebhookReceiver,
    stores: Stores,
    publisher: KafkaPublisher,
    kafka_bootstrap: str,
) -> None:
    pool = admit(api.settings.database_url, f"n-{uuid.uuid4().hex[:10]}", TENANT)
    everywhere = await subscribe(api, receiver.url + "/all")
    await subscribe(api, receiver.url + "/elsewhere", pool="another-pool")  # not this pool's: told nothing
    [message] = await make_executions(stores, pool, "charge")
    ident = uuid.UUID(message.execution_id)
    await stores.database.pool.execute(
        "UPDATE executions SET state = 'DEAD', error = 'CardDeclined: sdl1:AAAA', finished_at = now() WHERE id = $1",
        ident,
    )
    # A sweeper that recorded the incident and died before marking the dead letter: its successor reads the same
    # row and records it again, as nothing new.
    rows = await stores.executions.dead_letters(10)
    assert await stores.notifications.record_incidents(dead_incidents(rows)) == (1, 1)
    ensure_topics(kafka_bootstrap, [DLQ_TOPIC])
    assert (await Sweeper(stores, publisher, SweeperConfig()).run_once()).dead_lettered == 1
    assert await stores.database.pool.fetchval("SELECT count(*) FROM notification_incidents") == 1

    receiver.script(Reply(503, headers={"Retry-After": "1"}), Reply(204))
    await deliveries_of(api).run_once()
    await wait_until(lambda: _received(receiver, 1), "the first attempt")
    # The backoff is 10 s or more; time moves on for the test.
    await stores.database.pool.execute("UPDATE notification_deliveries SET next_attempt_at = now()")
    await deliveries_of(api).run_once()
    await wait_until(lambda: _received(receiver, 2), "the second attempt")

    first, second = receiver.received
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert {r.path for r in receiver.received} == {"/all"}
    secret = everywhere["secret"]
    event = Webhook(secret).verify(second.body, second.headers)
    assert event["type"] == "execution.dead"
    assert event["data"]["executionId"] == str(ident) and event["data"]["pool"] == pool
    assert event["data"]["errorClass"] == "CardDeclined" and "sdl1" not in second.body.decode()

    async def delivered() -> bool:
        log = (await api.client.get(f"{SUBSCRIPTIONS}/{everywhere['id']}/deliveries", headers=api.auth())).json()
        return [(d["state"], d["attempts"], d["lastStatus"]) for d in log["items"]] == [("DELIVERED", 2, 204)]

    await wait_until(delivered, "the delivery log to show the delivery")
    await deliveries_of(api).run_once()
    assert len(receiver.received) == 2


@pytest.mark.parametrize("api", LOOPBACK_ALLOWED, indirect=True)
async def test_two_sweepers_record_each_dead_incident_once_and_retention_spares_pending_ones(
    api: Api,  # noqa: F811
    receiver: WebhookReceiver,
    stores: Stores,
    publisher: KafkaPublisher,
    kafka_bootstrap: str,
) -> None:
    """The old active sweeper still finishing its pass while its successor starts one: both read the same rows."""
    pool = admit(api.settings.database_url, f"n-{uuid.uuid4().hex[:10]}", TENANT)
    await subscribe(api, receiver.url)
    messages = await make_executions(stores, pool, "charge", 20)
    await stores.database.pool.execute(
        "UPDATE executions SET state = 'DEAD', error = 'X: y', finished_at = now() WHERE id = ANY($1)",
        [uuid.UUID(m.execution_id) for m in messages],
    )
    ensure_topics(kafka_bootstrap, [DLQ_TOPIC])
    old, new = Sweeper(stores, publisher, SweeperConfig()), Sweeper(stores, publisher, SweeperConfig())
    await asyncio.gather(old.publish_dead_letters(), new.publish_dead_letters())
    counts = await stores.database.pool.fetchrow(
        "SELECT (SELECT count(*) FROM notification_incidents) AS incidents, "
        "(SELECT count(*) FROM notification_deliveries) AS deliveries, "
        "(SELECT count(DISTINCT incident_key) FROM notification_incidents) AS keys"
    )
    assert dict(counts) == {"incidents": 20, "deliveries": 20, "keys": 20}

    # Past retention, incidents go with their deliveries, but never one still being delivered.
    await stores.database.pool.execute("UPDATE notification_incidents SET occurred_at = now() - interval '40 days'")
    pending = await stores.database.pool.fetchval("SELECT incident_id FROM notification_deliveries LIMIT 1")
    await stores.database.pool.execute(
        "UPDATE notification_deliveries SET state = 'DELIVERED' WHERE incident_id <> $1", pending
    )
    retention = IncidentRetention(stores.notifications, IncidentRetentionConfig(keep_days=30, batch=7))
    assert await retention.run_once() == 19
    assert await stores.database.pool.fetchval("SELECT count(*) FROM notification_deliveries") == 1


@pytest.mark.parametrize("api", LOOPBACK_ALLOWED, indirect=True)
async def test_a_breaker_that_opens_and_closes_is_told_to_its_pools_subscribers(
    api: Api,  # noqa: F811
    receiver: WebhookReceiver,
    stores: Stores,
    redis_url: str,
    kafka_bootstrap: str,
) -> None:
    pool = admit(api.settings.database_url, f"n-{uuid.uuid4().hex[:10]}", TENANT)
    ensure_topics(kafka_bootstrap, [pool_topic(pool)])
    created = await subscribe(api, receiver.url, events=["breaker.opened", "breaker.closed"], pool=pool)
    redis = Redis.from_url(redis_url)
    try:
        messages = await make_executions(stores, pool, "storm", 30, retry_policy=RETRY)
        await fail_attempts(stores, [uuid.UUID(m.execution_id) for m in messages], 1)
        judge = BreakerLoop(stores.breakers, HotWindow(redis), BreakerLoopConfig(defaults=SETTINGS))
        assert (await judge.run_once()).opened == 1
        assert (await judge.run_once()).opened == 0
        # The tenant turns its breakers off: the open one closes.
        off = BreakerLoop(
            stores.breakers,
            HotWindow(redis),
            BreakerLoopConfig(defaults=dataclasses.replace(SETTINGS, enabled=False)),
        )
        assert (await off.run_once()).closed == 1
    finally:
        await redis.aclose()
    await deliveries_of(api).run_once()
    await wait_until(lambda: _received(receiver, 2), "both notifications")
    events = [Webhook(created["secret"]).verify(r.body, r.headers) for r in receiver.received]
    assert sorted(e["type"] for e in events) == ["breaker.closed", "breaker.opened"]
    assert {(e["data"]["pool"], e["data"]["handler"]) for e in events} == {(pool, "storm")}


@pytest.mark.parametrize("api", LOOPBACK_ALLOWED, indirect=True)
async def test_an_operator_opening_and_closing_a_breaker_is_told_once_each_with_the_move(
    api: Api,  # noqa: F811
    receiver: WebhookReceiver,
    stores: Stores,
) -> None:
    created = await subscribe(api, receiver.url, events=["breaker.opened", "breaker.closed"])
    await api.db.execute("INSERT INTO breakers (tenant_id, pool, handler) VALUES ($1, 'demo', 'send')", TENANT)
    [breaker] = await stores.breakers.tenant_breakers(TENANT, "demo", None)
    # A move whose incident cannot be written does not happen either: they are one transaction.
    await api.db.execute(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE 'refused'; END $$;"
        "CREATE TRIGGER refuse BEFORE INSERT ON notification_incidents FOR EACH ROW EXECUTE FUNCTION refuse()"
    )
    with pytest.raises(asyncpg.RaiseError, match="refused"):
        await stores.breakers.transition(Transition(breaker, "OPEN", "opened_by_operator", "ops", manual=True))
    assert await stores.breakers.get_breaker(TENANT, breaker.id) == breaker
    await api.db.execute("DROP TRIGGER refuse ON notification_incidents")

    for action in (":open", ":open", ":close", ":close"):  # the second of each changes nothing, tells nothing
        assert (await api.client.post(f"/v1/breakers/{breaker.id}{action}", headers=api.auth())).status_code == 200
    await deliveries_of(api).run_once()
    await wait_until(lambda: _received(receiver, 2), "both notifications")
    events = [Webhook(created["secret"]).verify(r.body, r.headers) for r in receiver.received]
    assert sorted((e["type"], e["data"]["byOperator"]) for e in events) == [
        ("breaker.closed", True),
        ("breaker.opened", True),
    ]
    assert await stores.database.pool.fetchval("SELECT count(*) FROM notification_incidents") == 2


@pytest.mark.parametrize("api", LOOPBACK_ALLOWED, indirect=True)
async def test_an_occurrence_not_started_in_time_is_one_late_incident_whoever_saw_it(
    api: Api,  # noqa: F811
    receiver: WebhookReceiver,
    stores: Stores,
) -> None:
    pool = admit(api.settings.database_url, f"n-{uuid.uuid4().hex[:10]}", TENANT)
    watch = LateStarts(stores.notifications, LateStartsConfig(grace_sec=60))
    [message] = await make_executions(stores, pool, "nightly")
    ident = uuid.UUID(message.execution_id)
    # Due two minutes ago, never started (no worker in the pool): late, but nobody subscribed, so nothing is kept.
    await stores.database.pool.execute(
        "UPDATE executions SET scheduled_for = scheduled_for - interval '2 minutes', "
        "fire_at = coalesce(fire_at, scheduled_for) - interval '2 minutes' WHERE id = $1",
        ident,
    )
    assert await watch.run_once() == LateStartsPass()
    created = await subscribe(api, receiver.url, events=["execution.late"])
    assert (await watch.run_once()).incidents == 1
    assert (await watch.run_once()).incidents == 0  # the next pass (or another sweeper) finds it recorded
    await deliveries_of(api).run_once()
    await wait_until(lambda: _received(receiver, 1), "the late-start notification")
    [got] = receiver.received
    event = Webhook(created["secret"]).verify(got.body, got.headers)
    assert event["type"] == "execution.late" and event["data"]["executionId"] == str(ident)
    assert event["data"]["dispatched"] is True and event["data"]["pool"] == pool

    # A job whose fire time passed with no dispatcher to make its execution is late as well.
    due = datetime.now(UTC) - timedelta(minutes=5)
    job_id = new_id()
    await stores.jobs.insert_job(
        {
            "id": job_id,
            "tenant_id": TENANT,
            "name": "undispatched",
            "type": "ONE_SHOT",
            "run_at": due,
            "pool": pool,
            "handler": "nightly",
            "payload": {},
            "retry_policy": {},
            "timeout_sec": 30,
            "shard": 0,
            "next_fire_at": due,
        },
        actor="test",
    )
    assert (await watch.run_once()).incidents == 1
    [row] = await stores.database.pool.fetch(
        "SELECT detail FROM notification_incidents WHERE job_id = $1 AND event = 'execution.late'", job_id
    )
    assert row["detail"]["dispatched"] is False and row["detail"]["jobName"] == "undispatched"


@pytest.mark.parametrize("api", LOOPBACK_ALLOWED, indirect=True)
async def test_a_job_that_starts_failing_and_recovers_is_told_once_per_change(
    api: Api,  # noqa: F811
    receiver: WebhookReceiver,
    stores: Stores,
) -> None:
    pool = admit(api.settings.database_url, f"n-{uuid.uuid4().hex[:10]}", TENANT)
    [message] = await make_executions(stores, pool, "hourly")
    first = uuid.UUID(message.execution_id)
    db = stores.database.pool
    # batch=1: a pass reads the jobs one statement at a time, and still sees them all.
    watch = OutcomeChanges(stores.notifications, OutcomeChangesConfig(batch=1))
    created = await subscribe(api, receiver.url, events=["execution.failing", "execution.recovered"], pool=pool)

    async def occurrence(state: str, error: str | None = None) -> uuid.UUID:
        """The job's next occurrence, an hour after its latest, finished now in ``state``."""
        ident = new_id()
        await db.execute(
            "INSERT INTO executions (id, tenant_id, job_id, pool, handler, shard, fence_token, timeout_sec, "
            "attempt, max_attempts, state, scheduled_for, finished_at, error) "
            "SELECT $1, tenant_id, job_id, pool, handler, shard, fence_token, timeout_sec, 1, max_attempts, $3, "
            "(SELECT max(scheduled_for) FROM executions WHERE job_id = e.job_id) + interval '1 hour', now(), $4 "
            "FROM executions e WHERE id = $2",
            ident,
            first,
            state,
            error,
        )
        return ident

    await db.execute("UPDATE executions SET state = 'SUCCEEDED', finished_at = now() WHERE id = $1", first)
    assert (await watch.run_once()).incidents == 0  # a success, and nothing before it: no change
    failed = await occurrence("DEAD", "Timeout: sdl1:AAAA")
    assert (await watch.run_once()).incidents == 1
    assert (await watch.run_once()).incidents == 0  # the next pass (or another sweeper) finds it recorded
    await occurrence("DEAD", "Timeout: sdl1:AAAA")
    assert (await watch.run_once()).incidents == 0  # a failure after a failure is no change
    recovered = await occurrence("SUCCEEDED")
    assert (await watch.run_once()).incidents == 1
    await occurrence("SUCCEEDED")
    assert (await watch.run_once()).incidents == 0

    await deliveries_of(api).run_once()
    await wait_until(lambda: _received(receiver, 2), "the two notifications")
    events = sorted(
        (Webhook(created["secret"]).verify(r.body, r.headers) for r in receiver.received), key=lambda e: e["type"]
    )
    assert [(e["type"], e["data"]["executionId"]) for e in events] == [
        ("execution.failing", str(failed)),
        ("execution.recovered", str(recovered)),
    ]
    assert events[0]["data"]["errorClass"] == "Timeout" and "sdl1" not in receiver.received[0].body.decode()
    assert events[0]["data"]["previousExecutionId"] == str(first)
    assert events[1]["data"]["errorClass"] is None and events[1]["data"]["jobName"] == "hourly"


async def _received(receiver: WebhookReceiver, count: int) -> bool:
    return len(receiver.received) >= count
