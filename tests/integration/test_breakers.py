"""The retry circuit breaker over the real Postgres, Redis and broker: the sweeper's loop and the dispatcher's
fenced retry transaction driven pass by pass (``run_once``), no sleeping.

A handler's attempts fail → its breaker opens → claimed retries are held (failed state and attempt kept,
``heldBy`` set, the next attempt pushed to the next probe), also by the next leader → half-open lets exactly
its probes through → the probes succeed → it closes and releases the held retries spread over the window;
a failing probe re-opens it with a doubled cool-down; an operator's ``:open`` / ``:close`` over the API.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis
from sundial_common.broker.kafka import KafkaPublisher, ensure_topics
from sundial_common.broker.messages import pool_topic
from sundial_common.domain.ids import new_id
from sundial_common.hotwindow.window import HotWindow, member, retry_member
from sundial_common.observability.metrics import REGISTRY
from sundial_common.runtime.clock import from_ms, to_ms
from sundial_common.stores import Stores
from sundial_common.stores.breakers import BreakerSettings
from sundial_common.stores.dispatch import PlannedExecution
from sundial_common.stores.executions import Outcome
from sundial_common.stores.types import Occurrence, RetryDue
from sundial_sweeper.breakers import BreakerLoop, BreakerLoopConfig, BreakerPassResult, release

from tests.integration.test_reliability import TENANT, dispatcher, make_executions
from tests.support.api import Api, api  # noqa: F401  (the `api` fixture)
from tests.support.pools import admit


@pytest.fixture
def pool(database_url: str) -> str:
    return admit(database_url, f"b-{uuid.uuid4().hex[:10]}", TENANT)


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Redis]:
    redis = Redis.from_url(redis_url)
    yield redis
    await redis.aclose()


RETRY = {"maxAttempts": 5, "backoff": "FIXED", "initialDelayMs": 200, "maxDelayMs": 200, "jitter": False}
SETTINGS = BreakerSettings(min_attempts=20, cooldown_sec=5, max_cooldown_sec=40, probes=3, release_spread_sec=10)


def loop(stores: Stores, client: Redis) -> BreakerLoop:
    return BreakerLoop(stores.breakers, HotWindow(client), BreakerLoopConfig(defaults=SETTINGS, actor="test"))


async def fail_attempts(stores: Stores, ids: list[uuid.UUID], attempt: int, state: str = "FAILED") -> None:
    won = await stores.executions.start_executions("w", [(i, attempt) for i in ids])
    assert len(won) == len(ids)
    await stores.executions.finish_attempts(
        "w",
        [Outcome(i, attempt, state, error=None if state == "SUCCEEDED" else "down", retry_delay_ms=200) for i in ids],
    )


async def due_now(stores: Stores, client: Redis, ids: list[uuid.UUID]) -> None:
    """Make the scheduled retries due (as time passing would) and put their members in the hot window."""
    await stores.database.pool.execute(
        "UPDATE executions SET next_attempt_at = now() - interval '1 second' WHERE id = ANY($1)", ids
    )
    rows = await stores.database.pool.fetch("SELECT id, next_attempt_at FROM executions WHERE id = ANY($1)", ids)
    await HotWindow(client).add_retries(0, [RetryDue(r["id"], r["next_attempt_at"]) for r in rows])


async def probing(
    stores: Stores, client: Redis, publisher: KafkaPublisher, pool: str, kafka_bootstrap: str, handler: str
) -> tuple[BreakerLoop, list[uuid.UUID]]:
    """The handler's 20 executions failed their first attempt, its breaker opened, its cool-down is over and the
    half-open breaker's probes are dispatched: the loop, and the probes' ids."""
    ensure_topics(kafka_bootstrap, [pool_topic(pool)])
    ids = [uuid.UUID(m.execution_id) for m in await make_executions(stores, pool, handler, 20, retry_policy=RETRY)]
    breakers = loop(stores, client)
    await fail_attempts(stores, ids, 1)
    await breakers.run_once()
    await stores.database.pool.execute("UPDATE breakers SET next_probe_at = now() - interval '1 second'")
    await breakers.run_once()
    await due_now(stores, client, ids)
    assert (await dispatcher(stores, client, publisher, token=5).run_once()).retried == SETTINGS.probes
    probes = [
        r["id"]
        for r in await stores.database.pool.fetch("SELECT id FROM executions WHERE id = ANY($1) AND attempt = 2", ids)
    ]
    return breakers, probes


async def test_open_holds_retries_across_leaders_half_open_probes_and_close_releases(
    stores: Stores,
    client: Redis,
    publisher: KafkaPublisher,
    pool: str,
    kafka_bootstrap: str,
) -> None:
    ensure_topics(kafka_bootstrap, [pool_topic(pool)])
    messages = await make_executions(stores, pool, "storm", 30, retry_policy=RETRY)
    ids = [uuid.UUID(m.execution_id) for m in messages]
    breakers = loop(stores, client)

    await fail_attempts(stores, ids, 1)
    assert (await breakers.run_once()).opened == 1
    [breaker] = await stores.breakers.tenant_breakers(TENANT, pool, None)
    assert (breaker.state, breaker.attempts, breaker.failures) == ("OPEN", 30, 30)
    labels = {"tenant": TENANT, "pool": pool, "handler": "storm"}
    assert REGISTRY.get_sample_value("sundial_breaker_state", labels) == 2

    # Claimed retries are held by this leader, and by the next one: not attempted, not counted, not lost.
    for token in (5, 6):
        await due_now(stores, client, ids)
        result = await dispatcher(stores, client, publisher, token=token).run_once()
        assert result.retried == 0
        rows = await stores.database.pool.fetch("SELECT * FROM executions WHERE id = ANY($1)", ids)
        assert {(r["state"], r["attempt"], r["held_by"]) for r in rows} == {("FAILED", 1, breaker.id)}
        assert all(r["next_attempt_at"] > breaker.next_probe_at for r in rows)
        # Back in the hot window at the held time, so nothing depends on the hydrator to find them again.
        score = await client.zscore(HotWindow(client).key(0), retry_member(ids[0]))
        assert score is not None and score > datetime.now(UTC).timestamp() * 1000
    assert (await stores.breakers.get_breaker(TENANT, breaker.id)).held == 30  # type: ignore[union-attr]

    # Cool-down over: half-open lets exactly its probes through.
    await stores.database.pool.execute("UPDATE breakers SET next_probe_at = now() - interval '1 second'")
    assert (await breakers.run_once()).half_opened == 1
    await due_now(stores, client, ids)
    result = await dispatcher(stores, client, publisher, token=7).run_once()
    assert result.retried == SETTINGS.probes
    probes = [
        r["id"]
        for r in await stores.database.pool.fetch(
            "SELECT id FROM executions WHERE id = ANY($1) AND state = 'PENDING'", ids
        )
    ]
    assert len(probes) == SETTINGS.probes

    # The probes succeed: closed, and every held retry released within the spread, with its attempt unchanged.
    await fail_attempts(stores, probes, 2, "SUCCEEDED")
    before = datetime.now(UTC)
    passed = await breakers.run_once()
    assert (passed.closed, passed.released) == (1, 30 - SETTINGS.probes)
    rows = await stores.database.pool.fetch("SELECT * FROM executions WHERE id = ANY($1) AND state = 'FAILED'", ids)
    assert len(rows) == 30 - SETTINGS.probes
    assert all(r["held_by"] is None and r["attempt"] == 1 for r in rows)
    spread = timedelta(seconds=SETTINGS.release_spread_sec)
    times = [r["next_attempt_at"] for r in rows]
    assert all(before - timedelta(seconds=5) < t < datetime.now(UTC) + spread for t in times)
    assert max(times) - min(times) > spread / 4  # spread out, not one instant
    assert REGISTRY.get_sample_value("sundial_breaker_state", labels) == 0
    trail = await stores.audit.entries(TENANT, "breaker", breaker.id)
    assert [(e.action, e.to_state) for e in trail] == [
        ("opened", "OPEN"),
        ("half_opened", "HALF_OPEN"),
        ("closed", "CLOSED"),
    ]


async def test_a_quiet_stack_costs_one_statement_a_pass_and_failures_are_still_judged_on_the_next(
    stores: Stores, client: Redis, pool: str, kafka_bootstrap: str
) -> None:
    ensure_topics(kafka_bootstrap, [pool_topic(pool)])
    breakers = loop(stores, client)
    assert await stores.breakers.quiet()
    await breakers.run_once()  # a term's first pass judges everything (and sets the gauges), quiet or not
    assert await breakers.run_once() == BreakerPassResult()

    messages = await make_executions(stores, pool, "storm", 30, retry_policy=RETRY)
    await fail_attempts(stores, [uuid.UUID(m.execution_id) for m in messages], 1)
    assert not await stores.breakers.quiet()
    assert (await breakers.run_once()).opened == 1
    assert not await stores.breakers.quiet()  # an open breaker is not quiet


async def test_a_new_handlers_failures_count_though_they_ended_seconds_before_its_breaker_existed(
    stores: Stores, client: Redis, pool: str, kafka_bootstrap: str
) -> None:
    """A handler's breaker row is created by the first pass that sees it; what ended before (a second or more
    earlier on a slow pass) is its window too, not lost."""
    ensure_topics(kafka_bootstrap, [pool_topic(pool)])
    messages = await make_executions(stores, pool, "storm", 30, retry_policy=RETRY)
    await fail_attempts(stores, [uuid.UUID(m.execution_id) for m in messages], 1)
    await stores.database.pool.execute(
        "UPDATE breaker_counts SET bucket = bucket - interval '3 seconds' WHERE pool = $1", pool
    )
    assert (await loop(stores, client).run_once()).opened == 1
    [breaker] = await stores.breakers.tenant_breakers(TENANT, pool, None)
    assert (breaker.state, breaker.attempts, breaker.failures) == ("OPEN", 30, 30)


async def test_attempts_count_once_by_their_end_whatever_instant_the_worker_recorded(
    stores: Stores, pool: str, kafka_bootstrap: str
) -> None:
    """A worker writes its outcomes a few at a time with each handler's own end instant, before the transaction's:
    each attempt is counted in the window once, when its statement moves it out of RUNNING."""
    ensure_topics(kafka_bootstrap, [pool_topic(pool)])
    ids = [uuid.UUID(m.execution_id) for m in await make_executions(stores, pool, "late", 4, retry_policy=RETRY)]
    await stores.executions.start_executions("w", [(i, 1) for i in ids])
    await asyncio.sleep(0.2)
    ended = datetime.now(UTC) - timedelta(milliseconds=80)  # after the start, before the write
    await stores.executions.finish_attempts(
        "w",
        [
            Outcome(
                i, 1, "SUCCEEDED" if n else "FAILED", error=None if n else "down", retry_delay_ms=200, finished_at=ended
            )
            for n, i in enumerate(ids)
        ],
    )
    await stores.database.pool.execute("UPDATE executions SET held_by = NULL WHERE id = ANY($1)", ids)
    counts = await stores.database.pool.fetchrow(
        "SELECT sum(attempts) AS attempts, sum(failures) AS failures FROM breaker_counts WHERE pool = $1", pool
    )
    assert (counts["attempts"], counts["failures"]) == (4, 1)
    row = await stores.database.pool.fetchrow(
        "SELECT finished_at, next_attempt_at FROM executions WHERE id = $1", ids[0]
    )
    assert row["finished_at"] == ended, "the end as the worker recorded it"
    assert row["next_attempt_at"] - row["finished_at"] == timedelta(milliseconds=200), "the backoff counts from it"


async def test_a_failing_probe_reopens_with_a_longer_cool_down(
    stores: Stores,
    client: Redis,
    publisher: KafkaPublisher,
    pool: str,
    kafka_bootstrap: str,
) -> None:
    breakers, probes = await probing(stores, client, publisher, pool, kafka_bootstrap, "down")
    await fail_attempts(stores, probes, 2)
    assert (await breakers.run_once()).opened == 1
    [breaker] = await stores.breakers.tenant_breakers(TENANT, pool, None)
    assert (breaker.state, breaker.cooldown_sec, breaker.opens) == ("OPEN", 2 * SETTINGS.cooldown_sec, 2)
    assert breaker.next_probe_at is not None
    assert breaker.next_probe_at > datetime.now(UTC) + timedelta(seconds=1.5 * SETTINGS.cooldown_sec)


async def test_an_operator_opens_and_closes_a_breaker_over_the_api(api: Api) -> None:  # noqa: F811
    await api.db.execute("INSERT INTO breakers (tenant_id, pool, handler) VALUES ($1, 'demo', 'send')", TENANT)
    listed = (await api.client.get("/v1/breakers", headers=api.auth())).json()["items"]
    [breaker] = [b for b in listed if b["handler"] == "send"]
    assert (breaker["state"], breaker["held"], breaker["failureRatio"]) == ("CLOSED", 0, None)
    # Another tenant neither sees nor moves it.
    assert (await api.client.get("/v1/breakers", headers=api.auth("other"))).json()["items"] == []
    other = await api.client.post(f"/v1/breakers/{breaker['id']}:open", headers=api.auth("other"))
    assert other.status_code == 404

    opened = await api.client.post(f"/v1/breakers/{breaker['id']}:open", headers=api.auth())
    assert opened.status_code == 200 and (opened.json()["state"], opened.json()["manual"]) == ("OPEN", True)
    assert (await api.client.get("/v1/breakers", params={"state": "OPEN"}, headers=api.auth())).json()["items"]
    closed = await api.client.post(f"/v1/breakers/{breaker['id']}:close", headers=api.auth())
    assert closed.status_code == 200 and (closed.json()["state"], closed.json()["manual"]) == ("CLOSED", False)
    trail = (await api.client.get(f"/v1/breakers/{breaker['id']}/audit", headers=api.auth())).json()["items"]
    assert [e["action"] for e in trail] == ["opened_by_operator", "closed_by_operator"]
    bad = await api.client.get("/v1/breakers", params={"state": "AJAR"}, headers=api.auth())
    assert bad.status_code == 422
    # A job's breaker choice is validated and shown.
    body = {
        "name": "j",
        "type": "DELAYED",
        "delaySeconds": 60,
        "target": {"pool": "demo", "handler": "send"},
        "breaker": {"firstFires": "SOMETIMES"},
    }
    refused = await api.create(body)
    assert refused.status_code == 422 and refused.json()["errors"][0]["field"].startswith("breaker"), refused.text
    created = await api.create({**body, "breaker": {"firstFires": "HOLD"}})
    assert created.status_code == 201, created.text
    assert created.json()["breaker"] == {"enabled": True, "firstFires": "HOLD"}


async def test_first_fires_run_as_usual_unless_the_job_chose_to_hold_them(
    stores: Stores, client: Redis, pool: str
) -> None:
    due = from_ms(to_ms(datetime.now(UTC)))
    jobs = {}
    for name, choice in (("run", None), ("hold", {"enabled": True, "firstFires": "HOLD"})):
        jobs[name] = new_id()
        await stores.jobs.insert_job(
            {
                "id": jobs[name],
                "tenant_id": TENANT,
                "name": name,
                "type": "ONE_SHOT",
                "run_at": due,
                "pool": pool,
                "handler": "down",
                "timeout_sec": 30,
                "shard": 0,
                "next_fire_at": due,
                "breaker": choice,
            },
            actor="test",
        )
    await stores.database.pool.execute(
        "INSERT INTO breakers (tenant_id, pool, handler, state, next_probe_at, cooldown_sec)"
        " VALUES ($1, $2, 'down', 'OPEN', now() + interval '30 seconds', 30)",
        TENANT,
        pool,
    )

    def plan(rows: Any) -> list[PlannedExecution]:
        return [PlannedExecution(new_id(), row, None, None) for row in rows]

    claims = [Occurrence(j, due) for j in jobs.values()]
    outcome = await stores.dispatch.dispatch_occurrences(0, 1, "test", claims, plan)
    assert [p.job["id"] for p in outcome.created] == [jobs["run"]]
    [held] = outcome.misplaced
    held_job = await stores.database.pool.fetchrow("SELECT * FROM jobs WHERE id = $1", jobs["hold"])
    assert held.job_id == jobs["hold"] and held.due == held_job["next_fire_at"]
    assert held_job["next_fire_at"] > datetime.now(UTC) + timedelta(seconds=25)
    assert held_job["next_nominal_at"] == due  # the occurrence keeps its time; only its fire moves

    # The breaker closes: the held fire is released within the spread and put back into the hot window.
    await stores.database.pool.execute("UPDATE breakers SET state = 'CLOSED' WHERE pool = $1", pool)
    [breaker] = await stores.breakers.tenant_breakers(TENANT, pool, None)
    assert await release(stores.breakers, HotWindow(client), breaker, SETTINGS.release_spread_sec) == 1
    released = await stores.database.pool.fetchval("SELECT next_fire_at FROM jobs WHERE id = $1", jobs["hold"])
    assert released < datetime.now(UTC) + timedelta(seconds=SETTINGS.release_spread_sec)
    assert await client.zscore(HotWindow(client).key(0), member(jobs["hold"])) == to_ms(released)


async def test_a_flaky_handlers_probes_close_the_breaker_though_one_failed(
    stores: Stores,
    client: Redis,
    publisher: KafkaPublisher,
    pool: str,
    kafka_bootstrap: str,
) -> None:
    breakers, probes = await probing(stores, client, publisher, pool, kafka_bootstrap, "flaky")
    await fail_attempts(stores, probes[:1], 2)  # one of three: a ratio below failureRatio (0.5)
    await fail_attempts(stores, probes[1:], 2, "SUCCEEDED")
    assert (await breakers.run_once()).closed == 1
    [breaker] = await stores.breakers.tenant_breakers(TENANT, pool, None)
    assert (breaker.state, breaker.held) == ("CLOSED", 0)


@pytest.mark.parametrize("max_attempts", [2, 3])
async def test_retries_held_past_max_hold_end_without_running_and_reach_dead(
    stores: Stores,
    client: Redis,
    publisher: KafkaPublisher,
    pool: str,
    kafka_bootstrap: str,
    max_attempts: int,
) -> None:
    """A handler that stays broken: 1,000 executions, held by its open breaker past maxHoldSec, all end DEAD within
    their remaining backoff — each attempt after the bound ends at once (BreakerHeld), never calling the handler,
    and never counted in the breaker's window."""
    ensure_topics(kafka_bootstrap, [pool_topic(pool)])
    retry = {**RETRY, "maxAttempts": max_attempts}
    ids = [uuid.UUID(m.execution_id) for m in await make_executions(stores, pool, "broken", 1000, retry_policy=retry)]
    breakers = loop(stores, client)
    await fail_attempts(stores, ids, 1)
    await breakers.run_once()
    await due_now(stores, client, ids)
    for _ in range(20):
        await dispatcher(stores, client, publisher, token=5).run_once()
        held = await stores.database.pool.fetchval(
            "SELECT count(*) FROM executions WHERE id = ANY($1) AND held_since IS NOT NULL", ids
        )
        if held == 1000:
            break
    assert held == 1000
    assert await stores.database.pool.fetchval("SELECT count(*) FROM executions WHERE state = 'RUNNING'") == 0
    failures = await stores.database.pool.fetchval("SELECT sum(failures) FROM breaker_counts WHERE pool = $1", pool)

    # An hour later (the default maxHoldSec), the breaker still open: each held retry that comes due ends.
    await stores.database.pool.execute("UPDATE executions SET held_since = held_since - interval '3601 seconds'")
    for _ in range(20):
        await due_now(stores, client, ids)
        await dispatcher(stores, client, publisher, token=6).run_once()
        states = await stores.database.pool.fetch(
            "SELECT state, count(*) FROM executions WHERE id = ANY($1) GROUP BY state", ids
        )
        if dict(states) == {"DEAD": 1000}:
            break
    assert dict(
        await stores.database.pool.fetch(
            "SELECT state, count(*) FROM executions WHERE id = ANY($1) GROUP BY state", ids
        )
    ) == {"DEAD": 1000}
    rows = await stores.database.pool.fetch(
        "SELECT attempt, error, held_by, next_attempt_at FROM executions WHERE id = ANY($1)", ids
    )
    assert {(r["attempt"], r["held_by"], r["next_attempt_at"]) for r in rows} == {(max_attempts, None, None)}
    assert all(r["error"].startswith("BreakerHeld") for r in rows)
    ended = await stores.database.pool.fetchval(
        "SELECT count(*) FROM execution_attempts WHERE execution_id = ANY($1) AND worker_id = 'breaker'", ids
    )
    assert ended == 1000 * (max_attempts - 1)  # every attempt after the first ended without running
    assert (
        await stores.database.pool.fetchval("SELECT sum(failures) FROM breaker_counts WHERE pool = $1", pool)
        == failures
    )  # the handler was never called: its window says nothing new
    assert len(await stores.executions.dead_letters(2000)) >= 1000  # the dead-letter queue shows the problem


async def test_a_jobs_own_max_hold_bounds_its_retries_and_not_the_others(
    stores: Stores,
    client: Redis,
    publisher: KafkaPublisher,
    pool: str,
    kafka_bootstrap: str,
) -> None:
    ensure_topics(kafka_bootstrap, [pool_topic(pool)])
    messages = await make_executions(stores, pool, "down", 30, retry_policy=RETRY)
    ids = [uuid.UUID(m.execution_id) for m in messages]
    short = ids[:10]
    await stores.database.pool.execute(
        "UPDATE jobs SET breaker = $2 WHERE id IN (SELECT job_id FROM executions WHERE id = ANY($1))",
        short,
        {"maxHoldSec": 60},
    )
    await fail_attempts(stores, ids, 1)
    await loop(stores, client).run_once()
    await due_now(stores, client, ids)
    await dispatcher(stores, client, publisher, token=5).run_once()
    # 61 s later: past the job's own 60 s, well inside the tenant's hour.
    await stores.database.pool.execute("UPDATE executions SET held_since = held_since - interval '61 seconds'")
    await due_now(stores, client, ids)
    await dispatcher(stores, client, publisher, token=6).run_once()
    rows = await stores.database.pool.fetch("SELECT id, attempt, state, error FROM executions WHERE id = ANY($1)", ids)
    ended = {r["id"] for r in rows if r["attempt"] == 2}
    assert ended == set(short)
    assert all(r["state"] == "FAILED" and r["error"].startswith("BreakerHeld") for r in rows if r["id"] in ended)
    [breaker] = await stores.breakers.tenant_breakers(TENANT, pool, None)
    assert breaker.held == 30  # the ended ones wait for their next attempt, held again
