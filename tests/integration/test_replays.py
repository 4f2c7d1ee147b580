"""Replays on the real broker and Postgres: ``POST /v1/replays`` → the replayer → a staging worker.

In-process pieces (the API over ASGI, :class:`~sundial_replayer.replayer.Replayer` driven pass by pass, a
:class:`~sundial_worker.staging.StagingRuntime` in a task) on the session's real Tansu and Postgres. Source
messages are produced with broker timestamps spread over the last two minutes, so a window selects a known
subset without waiting; every test compares execution ids, not just counts. Kill -9 of a real replayer
process is the e2e test (``tests/e2e/test_replay_resume.py``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from redis.asyncio import Redis
from sundial_api import ApiSettings, create_app
from sundial_common.broker.kafka import ensure_topics
from sundial_common.broker.messages import ExecutionMessage, pool_topic
from sundial_common.broker.topic_windows import KafkaTopicInspector
from sundial_common.hotwindow.worker_announcements import WorkerAnnouncements
from sundial_common.runtime.clock import to_ms
from sundial_common.runtime.settings import CommonSettings
from sundial_common.security.auth import issue_token
from sundial_common.stores import Stores
from sundial_replayer.kafka import KafkaReplayKafka
from sundial_replayer.replayer import Replayer, ReplayerConfig
from sundial_worker import Context, Worker, WorkerConfig
from sundial_worker.consumer import consumer_group
from sundial_worker.staging import StagingRuntime

from tests.support.pools import admit
from tests.support.tenants import register_tenant

SECRET = "test-signing-key-for-the-replay-suite"
PARTITIONS = 3
PRODUCTION_TABLES = ("executions", "execution_attempts", "jobs", "audit_log", "idempotency_keys", "tenants")


def token(tenant: str = "acme", *, admin: bool = False) -> dict[str, str]:
    """A tenant's token, or (``admin``) an operator's of the tenant ``ops`` (the ``env`` fixture registers them)."""
    return {"Authorization": f"Bearer {issue_token(SECRET, 'ops' if admin else tenant, admin=admin)}"}


def iso(instant: datetime) -> str:
    return instant.isoformat().replace("+00:00", "Z")


@dataclass
class Sent:
    """A source message as produced: its body and broker timestamp."""

    message: ExecutionMessage
    at: datetime


def produce(bootstrap: str, sent: Iterable[Sent]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for s in sent:
        m = s.message
        producer.produce(m.topic, m.encode(), key=m.execution_id.encode(), headers=m.headers(), timestamp=to_ms(s.at))
    assert producer.flush(10) == 0


def broker_now() -> datetime:
    """Now, to the millisecond: the broker's timestamps carry milliseconds, so a window bound with microseconds would
    put a message sent at that very bound on the other side of it."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def history(pool: str, now: datetime, count: int, *, step: float = 2.0, start: float = 100.0) -> list[Sent]:
    """``count`` messages of ``pool``, one every ``step`` seconds from ``start`` seconds ago, over two handlers,
    three tenants and two jobs."""
    jobs = [str(uuid.uuid4()), str(uuid.uuid4())]
    out = []
    for i in range(count):
        out.append(
            Sent(
                ExecutionMessage(
                    execution_id=str(uuid.uuid4()),
                    job_id=jobs[i % 2],
                    tenant_id=("acme", "globex", "initech")[i % 3],
                    pool=pool,
                    handler=("charge", "refund")[i % 2],
                    attempt=1,
                    fence_token=7,
                    scheduled_for=iso(now),
                    timeout_sec=30,
                    payload={"i": i},
                ),
                now - timedelta(seconds=start - i * step),
            )
        )
    return out


@dataclass
class Env:
    client: httpx.AsyncClient
    stores: Stores
    db: asyncpg.Connection
    redis: Redis
    bootstrap: str
    settings: CommonSettings
    replayer: Replayer
    pool: str = field(default_factory=lambda: f"orders-{uuid.uuid4().hex[:8]}")

    @property
    def staging(self) -> str:
        return f"staging-{self.pool}"

    async def create(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
        return await self.client.post("/v1/replays", json=body, headers=headers or token(admin=True))

    async def replay(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
        response = await self.create(body, headers)
        assert response.status_code == 202, response.text
        return dict(response.json())

    async def get(self, replay_id: str) -> dict[str, Any]:
        response = await self.client.get(f"/v1/replays/{replay_id}", headers=token(admin=True))
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def run_to_end(self, replay_id: str, within: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            await self.replayer.run_once()
            view = await self.get(replay_id)
            if view["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                return view
        raise AssertionError(f"replay {replay_id} did not finish within {within}s: {await self.get(replay_id)}")

    async def runs(self, replay_id: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 7} | ({"cursor": cursor} if cursor else {})
            response = await self.client.get(f"/v1/replays/{replay_id}/runs", params=params, headers=token(admin=True))
            assert response.status_code == 200, response.text
            items += response.json()["items"]
            cursor = response.json()["nextCursor"]
            if cursor is None:
                return items


@pytest.fixture
async def env(database_url: str, redis_url: str, kafka_bootstrap: str) -> AsyncIterator[Env]:
    settings = ApiSettings(
        database_url=database_url, redis_url=redis_url, kafka_bootstrap=kafka_bootstrap, jwt_secret=SECRET
    )
    # The tenants of the tokens below (the operator's ``ops`` too: every token's tenant must be registered),
    # before any checksum of the production tables (tenants is one).
    for tenant in ("acme", "globex", "ops"):
        await register_tenant(database_url, tenant)
    app = create_app(settings)
    stores = await Stores.connect(database_url)
    db = await asyncpg.connect(database_url)
    redis = Redis.from_url(redis_url)
    kafka = KafkaReplayKafka(kafka_bootstrap, client_id="test-replayer")
    topics = KafkaTopicInspector(kafka_bootstrap)
    replayer = Replayer(stores, kafka, topics, ReplayerConfig(batch_size=500, slice_sec=1.0))
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api.test") as client,
        ):
            env = Env(client, stores, db, redis, kafka_bootstrap, settings, replayer)
            # The source pool, and its staging pool (the replay target), serve the three tenants of `history`.
            admit(database_url, env.pool, "acme", "globex", "initech")
            admit(database_url, env.staging, "acme", "globex", "initech", kind="staging")
            yield env
    finally:
        await topics.close()
        await kafka.close()
        await redis.aclose()
        await db.close()
        await stores.close()


class Staging:
    """A staging worker (``StagingRuntime``) serving ``pool`` in a task; ``seen`` is what its handlers got."""

    def __init__(self, env: Env, *, slow_sec: float = 0.0) -> None:
        self.seen: list[tuple[uuid.UUID, Any]] = []
        worker = Worker(pool=env.staging, concurrency=16)

        async def handle(ctx: Context, payload: Any) -> None:
            assert ctx.replay is not None and ctx.replay.original_execution_id == ctx.execution_id
            self.seen.append((ctx.execution_id, ctx.replay))
            if payload["i"] % 5 == 4:
                raise RuntimeError(f"boom {payload['i']}")
            await asyncio.sleep(slow_sec)

        worker.handler("charge")(handle)
        worker.handler("refund")(handle)
        self.runtime = StagingRuntime(worker, env.settings, config=WorkerConfig(concurrency=16), worker_id="staging-1")
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Staging:
        self.task = asyncio.create_task(self.runtime.run_until(self.stop))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 30)


async def until(condition: Any, within: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + within
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def production_checksum(env: Env) -> dict[str, Any]:
    """Every production table's rows, the hot window, and the production group's committed offsets."""
    sums: dict[str, Any] = {}
    for table in PRODUCTION_TABLES:
        sums[table] = await env.db.fetchval(
            f"SELECT count(*) || ':' || coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '') FROM {table} t"
        )
    # Workers' announcements aside: a staging worker announces itself like any worker (not production state).
    announcements = set(await env.redis.keys("sundial:worker*"))
    keys = [key for key in await env.redis.keys("*") if key not in announcements]
    sums["redis"] = sorted([(key, await env.redis.zrange(key, 0, -1, withscores=True)) for key in keys])
    consumer = Consumer({"bootstrap.servers": env.bootstrap, "group.id": consumer_group(env.pool)})
    try:
        tps = [TopicPartition(pool_topic(env.pool), p) for p in range(PARTITIONS)]
        sums["group"] = [(tp.partition, tp.offset) for tp in consumer.committed(tps, timeout=10)]
    finally:
        consumer.close()
    return sums


async def production_state(env: Env) -> None:
    """Some production rows (a job with its audit row and idempotency key, its hot-window member) and committed
    offsets of the production consumer group, so that anything touching them would show."""
    job = {
        "name": "nightly",
        "type": "DELAYED",
        "delaySeconds": 600,
        "target": {"pool": env.pool, "handler": "charge"},
        "payload": {"x": 1},
    }
    response = await env.client.post("/v1/jobs", json=job, headers={**token(), "Idempotency-Key": "k1"})
    assert response.status_code == 201, response.text
    consumer = Consumer(
        {"bootstrap.servers": env.bootstrap, "group.id": consumer_group(env.pool), "enable.auto.commit": False}
    )
    try:
        consumer.commit(
            offsets=[TopicPartition(pool_topic(env.pool), p, 2) for p in range(PARTITIONS)], asynchronous=False
        )
    finally:
        consumer.close()


# --- the request ---------------------------------------------------------------------------------


async def test_bad_requests_name_the_field_and_create_nothing(env: Env) -> None:
    now = broker_now()
    ensure_topics(env.bootstrap, [pool_topic(env.pool)], partitions=PARTITIONS)
    short = f"short-{uuid.uuid4().hex[:8]}"
    ensure_topics(env.bootstrap, [pool_topic(short)], retention_ms=60_000)
    good = {"sourcePool": env.pool, "from": iso(now - timedelta(minutes=2)), "to": iso(now), "targetPool": env.staging}
    cases: list[tuple[dict[str, Any], dict[str, str] | None, int, str]] = [
        ({**good, "from": iso(now), "to": iso(now - timedelta(minutes=1))}, None, 422, "to"),
        ({**good, "to": iso(now + timedelta(minutes=5))}, None, 422, "to"),
        ({**good, "from": "2026-01-01T00:00:00"}, None, 422, "from"),
        ({**good, "targetPool": env.pool}, None, 422, "targetPool"),
        ({**good, "targetPool": f"qa-{env.pool}"}, None, 422, "targetPool"),
        ({**good, "ratePerSec": 0}, None, 422, "ratePerSec"),
        ({**good, "filter": {"tenantId": "globex"}}, token("acme"), 403, "filter.tenantId"),
        ({**good, "sourcePool": "no-such-pool"}, None, 404, ""),
        # Staging by the registry's kind, not by name: a `staging-` name that is not registered is refused.
        ({**good, "targetPool": f"staging-{uuid.uuid4().hex[:8]}"}, None, 422, "targetPool"),
        ({**good, "sourcePool": short, "from": iso(now - timedelta(minutes=10))}, None, 409, "from"),
    ]
    for body, headers, status, fieldname in cases:
        response = await env.create(body, headers)
        assert response.status_code == status, (body, response.text)
        problem = response.json()
        if fieldname:
            assert fieldname in [e["field"] for e in problem["errors"]], problem
    # The 409 names the earliest instant the topic still keeps (its retention.ms is one minute).
    response = await env.create({**good, "sourcePool": short, "from": iso(now - timedelta(minutes=10))})
    earliest = datetime.fromisoformat(response.json()["detail"].rsplit(" ", 1)[1].replace("Z", "+00:00"))
    assert abs((earliest - (now - timedelta(minutes=1))).total_seconds()) < 30
    assert await env.db.fetchval("SELECT count(*) FROM replays") == 0
    # A tenant's replay is forced to its own messages; an admin's may cover the whole pool.
    mine = await env.replay(good, token("acme"))
    assert mine["filter"]["tenantId"] == "acme" and mine["state"] == "PENDING"
    whole = await env.replay(good)
    assert whole["filter"]["tenantId"] is None
    listed = await env.client.get("/v1/replays", headers=token("acme"))
    assert [r["replayId"] for r in listed.json()["items"]] == [mine["replayId"]]
    other = await env.client.get(f"/v1/replays/{whole['replayId']}", headers=token("acme"))
    assert other.status_code == 404
    # An admin sees every replay, newest first, a page at a time.
    third = await env.replay(good)
    first_page = (await env.client.get("/v1/replays?limit=2", headers=token(admin=True))).json()
    assert [r["replayId"] for r in first_page["items"]] == [third["replayId"], whole["replayId"]]
    params = {"limit": 2, "cursor": first_page["nextCursor"]}
    second_page = (await env.client.get("/v1/replays", params=params, headers=token(admin=True))).json()
    assert [r["replayId"] for r in second_page["items"]] == [mine["replayId"]] and second_page["nextCursor"] is None
    bad_cursor = await env.client.get("/v1/replays?cursor=nope", headers=token(admin=True))
    assert bad_cursor.status_code == 422 and bad_cursor.json()["errors"][0]["field"] == "cursor"


async def test_a_retried_create_with_its_idempotency_key_starts_one_replay(env: Env) -> None:
    now = broker_now()
    ensure_topics(env.bootstrap, [pool_topic(env.pool)], partitions=PARTITIONS)
    body = {"sourcePool": env.pool, "from": iso(now - timedelta(minutes=2)), "to": iso(now), "targetPool": env.staging}
    keyed = {**token("acme"), "Idempotency-Key": "replay-incident-42"}
    first = await env.create(body, keyed)
    again = await env.create(body, keyed)  # a client that lost the first answer
    assert first.status_code == again.status_code == 202, (first.text, again.text)
    assert again.json()["replayId"] == first.json()["replayId"]
    assert again.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
    other = await env.create({**body, "ratePerSec": 5}, keyed)  # the same key for another request
    assert other.status_code == 422 and [e["field"] for e in other.json()["errors"]] == ["Idempotency-Key"]
    bad = await env.create(body, {**token("acme"), "Idempotency-Key": "with space"})
    assert bad.status_code == 422 and [e["field"] for e in bad.json()["errors"]] == ["Idempotency-Key"]
    # Keys are per tenant: another tenant's request with the same key is its own replay.
    theirs = await env.create(body, {**token("globex"), "Idempotency-Key": "replay-incident-42"})
    assert theirs.status_code == 202 and theirs.json()["replayId"] != first.json()["replayId"]
    assert await env.db.fetchval("SELECT count(*) FROM replays") == 2


async def test_pool_topics_keep_messages_for_the_retention_setting(env: Env) -> None:
    topics = KafkaTopicInspector(env.bootstrap)
    try:
        ensure_topics(env.bootstrap, [pool_topic(env.pool)])  # as a worker creates its pool's topic
        info = await topics.describe(pool_topic(env.pool), datetime.now(UTC))
        assert info is not None and info.retention_ms == 7 * 24 * 3600 * 1000  # SUNDIAL_TOPIC_RETENTION_MS
        # Tansu deletes nothing, so the reach is the retention: a window of the last 7 days is replayable.
        assert info.earliest_available is not None
        assert abs((datetime.now(UTC) - timedelta(days=7) - info.earliest_available).total_seconds()) < 60
    finally:
        await topics.close()


# --- the replay ----------------------------------------------------------------------------------


async def test_a_replay_delivers_exactly_the_window_and_touches_no_production_state(env: Env) -> None:
    now = broker_now()
    ensure_topics(env.bootstrap, [pool_topic(env.pool)], partitions=PARTITIONS)
    sent = history(env.pool, now, 40)  # one every 2 s from 100 s ago to 22 s ago
    produce(env.bootstrap, sent)
    await production_state(env)
    before = await production_checksum(env)
    t1, t2 = now - timedelta(seconds=80), now - timedelta(seconds=50)
    expected = {uuid.UUID(s.message.execution_id) for s in sent if t1 <= s.at < t2}
    assert len(expected) == 15

    replay = await env.replay({"sourcePool": env.pool, "from": iso(t1), "to": iso(t2), "targetPool": env.staging})
    announcements = WorkerAnnouncements(env.redis)
    async with Staging(env) as staging:
        # The staging worker shows in its pool's view as a production worker does, with its handlers.
        await until(lambda: _announced(announcements, env.staging), what="the staging worker's announcement")
        view = (await env.client.get(f"/v1/pools/{env.staging}", headers=token())).json()
        assert view["workers"]["live"] == 1 and view["workers"]["handlers"] == ["charge", "refund"], view
        assert view["workers"]["items"][0]["workerId"] == "staging-1"
        done = await env.run_to_end(replay["replayId"])
        assert done["state"] == "SUCCEEDED", done
        assert done["matched"] == done["published"] == 15 and done["scanned"] >= 15
        assert len(done["partitions"]) == PARTITIONS
        await until(lambda: _count(env, replay["replayId"], 15), what="15 staging runs")
    assert {e for e, _ in staging.seen} == expected  # exactly the window: none before t1, none at or after t2
    assert await announcements.live(env.staging) == []  # a stopped staging worker withdraws at once
    runs = await env.runs(replay["replayId"])  # paged 7 at a time
    assert {uuid.UUID(r["originalExecutionId"]) for r in runs} == expected
    failed = {r["originalExecutionId"] for r in runs if r["outcome"] == "FAILED"}
    assert failed == {s.message.execution_id for s in sent if t1 <= s.at < t2 and s.message.payload["i"] % 5 == 4}
    assert all("boom" in r["error"] for r in runs if r["outcome"] == "FAILED")
    info = staging.seen[0][1]
    assert info.replay_id == uuid.UUID(replay["replayId"]) and info.source_topic == pool_topic(env.pool)
    assert t1 <= info.published_at < t2
    assert (await env.get(replay["replayId"]))["duplicates"] == 0
    assert await production_checksum(env) == before


async def _announced(announcements: WorkerAnnouncements, pool: str) -> bool:
    return bool(await announcements.live(pool))


async def _count(env: Env, replay_id: str, n: int) -> bool:
    return (
        int(await env.db.fetchval("SELECT count(*) FROM replay_runs WHERE replay_id = $1", uuid.UUID(replay_id))) >= n
    )


async def test_filters_select_exactly_what_they_say(env: Env) -> None:
    now = broker_now()
    ensure_topics(env.bootstrap, [pool_topic(env.pool)], partitions=PARTITIONS)
    sent = history(env.pool, now, 30)
    produce(env.bootstrap, sent)
    t1, t2 = now - timedelta(seconds=120), now - timedelta(seconds=1)
    window = {"sourcePool": env.pool, "from": iso(t1), "to": iso(t2), "targetPool": env.staging}
    a_job = sent[1].message.job_id

    def ids(pick: Any) -> set[uuid.UUID]:
        return {uuid.UUID(s.message.execution_id) for s in sent if pick(s.message)}

    # A tenant's token: only its own messages, and here only one handler's.
    by_tenant = await env.replay({**window, "filter": {"handler": "refund"}}, token("globex"))
    by_job = await env.replay({**window, "filter": {"jobId": a_job}, "dryRun": True})
    async with Staging(env) as staging:
        assert (await env.run_to_end(by_tenant["replayId"]))["published"] == len(
            ids(lambda m: m.tenant_id == "globex" and m.handler == "refund")
        )
        counted = await env.run_to_end(by_job["replayId"])
        await until(lambda: _count(env, by_tenant["replayId"], 5), what="the tenant's runs")
    assert {e for e, _ in staging.seen} == ids(lambda m: m.tenant_id == "globex" and m.handler == "refund")
    # A dry run counts what it would replay and publishes nothing.
    assert counted["matched"] == len(ids(lambda m: m.job_id == a_job)) and counted["published"] == 0
    assert counted["scanned"] == 30


def produce_markers(bootstrap: str, pool: str, at: Iterable[tuple[int, datetime]]) -> None:
    """The sweeper's markers (``sundial_sweeper.consumed``: no value, no key, no headers), one per (partition,
    broker timestamp)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for partition, instant in at:
        producer.produce(pool_topic(pool), value=None, partition=partition, timestamp=to_ms(instant))
    assert producer.flush(10) == 0


def read_topic(bootstrap: str, topic: str, count: int, within: float) -> list[bytes | None]:
    """The values of up to ``count`` messages of ``topic`` from its start, read for at most ``within`` seconds."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex}"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        values: list[bytes | None] = []
        deadline = time.monotonic() + within
        while len(values) < count and time.monotonic() < deadline:
            values += [m.value() for m in consumer.consume(count, 0.5) if m.error() is None]
        return values
    finally:
        consumer.close()


async def test_the_sweepers_markers_in_the_window_are_read_but_never_replayed_nor_matched(env: Env) -> None:
    now = broker_now()
    ensure_topics(env.bootstrap, [pool_topic(env.pool)], partitions=PARTITIONS)
    sent = history(env.pool, now, 20)  # one every 2 s from 100 s ago to 62 s ago
    produce(env.bootstrap, sent)
    # A quiet partition got a marker during the incident (a burst's dropped last messages): one on each partition.
    produce_markers(env.bootstrap, env.pool, [(p, now - timedelta(seconds=90 - p)) for p in range(PARTITIONS)])
    window = {"sourcePool": env.pool, "from": iso(now - timedelta(seconds=120)), "to": iso(now - timedelta(seconds=1))}
    expected = {uuid.UUID(s.message.execution_id) for s in sent}

    replay = await env.replay({**window, "targetPool": env.staging})  # an operator's: every message, no filter
    dry = await env.replay({**window, "targetPool": env.staging, "dryRun": True})
    async with Staging(env) as staging:
        done = await env.run_to_end(replay["replayId"])
        counted = await env.run_to_end(dry["replayId"])
        await until(lambda: _count(env, replay["replayId"], len(sent)), what="the staging runs")

    assert done["state"] == "SUCCEEDED", done
    assert done["matched"] == done["published"] == len(sent), "a marker is no execution: not matched, not published"
    assert counted["matched"] == len(sent) and counted["published"] == 0
    assert done["scanned"] == counted["scanned"] == len(sent) + PARTITIONS  # read, as every message of the window
    assert {e for e, _ in staging.seen} == expected
    assert {uuid.UUID(r["originalExecutionId"]) for r in await env.runs(replay["replayId"])} == expected
    # The staging topic holds the executions and nothing else (one more message is waited for a few seconds).
    copied = await asyncio.to_thread(read_topic, env.bootstrap, pool_topic(env.staging), len(sent) + 1, 5.0)
    assert len(copied) == len(sent) and None not in copied
    assert (await env.get(replay["replayId"]))["duplicates"] == 0


async def test_cancel_stops_a_running_replay(env: Env) -> None:
    now = broker_now()
    ensure_topics(env.bootstrap, [pool_topic(env.pool)], partitions=PARTITIONS)
    produce(env.bootstrap, history(env.pool, now, 200, step=0.4))
    replay = await env.replay(
        {
            "sourcePool": env.pool,
            "from": iso(now - timedelta(minutes=5)),
            "to": iso(now),
            "targetPool": env.staging,
            "ratePerSec": 50,
        }
    )
    runner = asyncio.create_task(env.run_to_end(replay["replayId"]))
    await until(lambda: _published(env, replay["replayId"]), what="the first published batch")
    response = await env.client.post(f"/v1/replays/{replay['replayId']}/cancel", headers=token(admin=True))
    assert response.status_code == 202 and response.json()["cancelRequestedAt"]
    done = await asyncio.wait_for(runner, 30)
    assert done["state"] == "CANCELLED" and 0 < done["published"] < 200
    await env.replayer.run_once()  # a later pass does nothing more
    assert (await env.get(replay["replayId"]))["published"] == done["published"]
    again = await env.client.post(f"/v1/replays/{replay['replayId']}/cancel", headers=token(admin=True))
    assert again.status_code == 409


async def _published(env: Env, replay_id: str) -> bool:
    return bool(await env.db.fetchval("SELECT published > 0 FROM replays WHERE id = $1", uuid.UUID(replay_id)))


async def test_the_rate_limit_holds(env: Env) -> None:
    now = broker_now()
    ensure_topics(env.bootstrap, [pool_topic(env.pool)], partitions=PARTITIONS)
    produce(env.bootstrap, history(env.pool, now, 600, step=0.1, start=90))
    replay = await env.replay(
        {
            "sourcePool": env.pool,
            "from": iso(now - timedelta(minutes=5)),
            "to": iso(now),
            "targetPool": env.staging,
            "ratePerSec": 200,
        }
    )
    done = await env.run_to_end(replay["replayId"])
    assert done["published"] == 600
    # The rate as the staging topic saw it: the broker timestamps of the first and last re-published message.
    stamps = _timestamps(env.bootstrap, pool_topic(env.staging), 600)
    span = (max(stamps) - min(stamps)) / 1000
    rate = 600 / span
    print(f"replay rate: 600 messages over {span:.2f}s = {rate:.1f}/s (limit 200/s)")
    assert 200 * 0.9 <= rate <= 200 * 1.1


def _timestamps(bootstrap: str, topic: str, count: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4().hex}"})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(4)])
        stamps: list[int] = []
        deadline = time.monotonic() + 30
        while len(stamps) < count and time.monotonic() < deadline:
            stamps += [m.timestamp()[1] for m in consumer.consume(1000, 0.5) if m.error() is None]
        assert len(stamps) == count
        return stamps
    finally:
        consumer.close()
