"""The worker gateway in process, against the real servers: a caller holding only a pool token pulls executions
(started for it, payload decrypted), heartbeats them with progress, learns of a cancel, and finishes them — each
outcome accepted once, a stale or foreign attempt token rejected; every endpoint refuses a missing, tenant, expired,
revoked or other pool's token; a feed leaves its consumer group once no caller pulls."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jwt
import pytest
from sundial_common.broker.kafka import KafkaPublisher
from sundial_common.security.auth import SymmetricKey, issue_token
from sundial_common.security.pool_tokens import issue_pool_token
from sundial_common.stores import Stores
from sundial_gateway.app import create_app
from sundial_gateway.settings import GatewaySettings

from tests.support.pools import admit
from tests.support.worker import dispatch, execution, publish, wait_until

SECRET = "gateway-test-secret-0123456789abcdef0"
KEY = SymmetricKey(None, SECRET)
TENANT = "acme"
OTHER = "globex"


@pytest.fixture
async def gateway(
    database_url: str, redis_url: str, kafka_bootstrap: str, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    fields: dict[str, Any] = {
        "gateway_leave_after_sec": 1.0,
        "gateway_session_timeout_sec": 3.0,
        "gateway_rate_per_token": 1000,
        **getattr(request, "param", {}),
    }
    settings = GatewaySettings(
        database_url=database_url, redis_url=redis_url, kafka_bootstrap=kafka_bootstrap, jwt_secret=SECRET, **fields
    )
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test", timeout=60) as http,
    ):
        yield http, app


async def pool_token(stores: Stores, pool: str, tenant: str = TENANT, *, ttl_sec: int = 600, **issue: Any) -> str:
    record = await stores.pool_tokens.create_token(
        f"pt_{uuid.uuid4().hex[:12]}", pool, tenant, f"{pool}-worker", "test", ttl_sec
    )
    return issue_pool_token(
        KEY, token_id=record.id, pool=pool, tenant=tenant, subject=record.subject, ttl_sec=ttl_sec, **issue
    )


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def pull_all(http: httpx.AsyncClient, token: str, session: str, want: int) -> list[dict[str, Any]]:
    leased: list[dict[str, Any]] = []
    deadline = time.monotonic() + 40
    while len(leased) < want and time.monotonic() < deadline:
        answer = await http.post(
            "/v1/worker/pull", json={"session": session, "max": want, "waitMs": 5000}, headers=bearer(token)
        )
        assert answer.status_code == 200, answer.text
        leased += answer.json()["executions"]
    return leased


def beat(lease: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "executionId": lease["executionId"],
        "attempt": lease["attempt"],
        "attemptToken": lease["attemptToken"],
        **extra,
    }


async def test_a_pool_token_pulls_heartbeats_and_finishes(
    gateway: tuple[httpx.AsyncClient, Any], stores: Stores, publisher: KafkaPublisher, database_url: str
) -> None:
    http, app = gateway
    pool = admit(database_url, f"gw-{uuid.uuid4().hex[:8]}", TENANT)
    token = await pool_token(stores, pool)
    messages = await dispatch(stores, pool, "echo", [{"n": 1}, {"n": 2}, {"n": 3}], tenant=TENANT)
    await publish(publisher, messages)

    leased = await pull_all(http, token, "session-one", 3)
    assert sorted(lease["payload"]["n"] for lease in leased) == [1, 2, 3]
    assert {lease["handler"] for lease in leased} == {"echo"} and all(lease["deadline"] for lease in leased)
    first, second, third = sorted(leased, key=lambda lease: lease["payload"]["n"])
    assert (await execution(stores, messages[0]))["state"] == "RUNNING"

    # Heartbeat with progress; a cancel requested meanwhile is answered.
    await stores.executions.cancel_execution(TENANT, uuid.UUID(third["executionId"]), "test")
    beats = await http.post(
        "/v1/worker/heartbeat",
        json={"session": "session-one", "running": [beat(first, progress={"done": 5}), beat(third)]},
        headers=bearer(token),
    )
    assert beats.status_code == 200, beats.text
    answers = {a["executionId"]: a for a in beats.json()["running"]}
    assert answers[first["executionId"]] == {
        "executionId": first["executionId"],
        "renewed": True,
        "cancel": False,
        "reason": None,
    }
    assert answers[third["executionId"]]["cancel"] is True

    # Another session of the same token cannot finish what this one holds; a tampered token neither.
    foreign = await http.post(
        "/v1/worker/finish",
        json={"session": "session-two", "outcomes": [{**beat(first), "state": "SUCCEEDED", "result": "stolen"}]},
        headers=bearer(token),
    )
    tampered_token = first["attemptToken"][:-2] + ("AA" if not first["attemptToken"].endswith("AA") else "BB")
    tampered = await http.post(
        "/v1/worker/finish",
        json={
            "session": "session-one",
            "outcomes": [{**beat(first), "attemptToken": tampered_token, "state": "SUCCEEDED"}],
        },
        headers=bearer(token),
    )
    for response in (foreign, tampered):
        assert response.status_code == 200 and response.json()["outcomes"][0]["accepted"] is False, response.text

    outcomes = [
        {**beat(first), "state": "SUCCEEDED", "result": {"echo": 1}},
        {**beat(second), "state": "FAILED", "error": {"type": "ValueError", "message": "boom", "traceback": "tb"}},
    ]
    finished = await http.post(
        "/v1/worker/finish", json={"session": "session-one", "outcomes": outcomes}, headers=bearer(token)
    )
    assert finished.status_code == 200, finished.text
    first_answer, second_answer = finished.json()["outcomes"]
    assert first_answer["accepted"] and first_answer["state"] == "SUCCEEDED"
    # No retry policy on these jobs: the failure is final.
    assert second_answer["accepted"] and second_answer["state"] in ("FAILED", "DEAD"), second_answer
    # The same finish again (its answer was lost): accepted as recorded, nothing written twice.
    again = await http.post(
        "/v1/worker/finish", json={"session": "session-one", "outcomes": outcomes[:1]}, headers=bearer(token)
    )
    assert again.json()["outcomes"][0]["accepted"] is True
    # A heartbeat for an attempt already finished is not "renewed": the caller is told it has ended.
    late = await http.post(
        "/v1/worker/heartbeat", json={"session": "session-one", "running": [beat(first)]}, headers=bearer(token)
    )
    [late_answer] = late.json()["running"]
    assert late_answer["renewed"] is False and "ended" in late_answer["reason"], late_answer
    row = await execution(stores, messages[0])
    assert row["state"] == "SUCCEEDED" and row["result"] == {"echo": 1}
    attempts = await stores.executions.execution_attempts(uuid.UUID(first["executionId"]))
    assert [a["state"] for a in attempts] == ["SUCCEEDED"]

    # No caller pulls any more: the feed leaves its consumer group.
    feeds = app.state.gateway.pulls.feeds()

    async def left() -> bool:
        return not any(feed.joined for feed in feeds)

    await wait_until(left, "the idle feed to leave its group", within=10)


async def test_every_endpoint_refuses_what_is_not_this_pools_token(
    gateway: tuple[httpx.AsyncClient, Any], stores: Stores, publisher: KafkaPublisher, database_url: str
) -> None:
    http, _ = gateway
    pool = admit(database_url, f"gw-{uuid.uuid4().hex[:8]}", TENANT)
    other_pool = admit(database_url, f"gw-{uuid.uuid4().hex[:8]}", OTHER)
    token = await pool_token(stores, pool)
    messages = await dispatch(stores, pool, "echo", [{"n": 1}], tenant=TENANT)
    await publish(publisher, messages)
    (lease,) = await pull_all(http, token, "session-one", 1)

    bodies = {
        "/v1/worker/pull": {"session": "session-one", "max": 1, "waitMs": 0},
        "/v1/worker/heartbeat": {"session": "session-one", "running": [beat(lease)]},
        "/v1/worker/finish": {"session": "session-one", "outcomes": [{**beat(lease), "state": "SUCCEEDED"}]},
        "/v1/worker/token": {},
    }
    expired = await pool_token(stores, pool, now=time.time() - 3600, ttl_sec=60)
    revoked = await pool_token(stores, pool)
    revoked_id = str(jwt.decode(revoked, options={"verify_signature": False})["jti"])
    await stores.pool_tokens.revoke_token(revoked_id, pool)
    refusals = {
        "none": {},
        "tenant token": bearer(issue_token(SECRET, TENANT)),
        "admin token": bearer(issue_token(SECRET, TENANT, admin=True)),
        "expired": bearer(expired),
        "revoked": bearer(revoked),
        "forged": bearer(
            issue_pool_token(
                SymmetricKey(None, "x" * 40), token_id="pt_x", pool=pool, tenant=TENANT, subject="s", ttl_sec=60
            )
        ),
    }
    for path, body in bodies.items():
        for what, headers in refusals.items():
            refused = await http.post(path, json=body, headers=headers)
            assert refused.status_code == 401, (path, what, refused.text)
            assert refused.headers["content-type"].startswith("application/problem+json")

    # Another pool's (and tenant's) token: it gets nothing of this pool, and cannot touch this caller's attempt.
    other = await pool_token(stores, other_pool, OTHER)
    nothing = await http.post("/v1/worker/pull", json=bodies["/v1/worker/pull"], headers=bearer(other))
    assert nothing.status_code == 200 and nothing.json()["executions"] == []
    beats = await http.post("/v1/worker/heartbeat", json=bodies["/v1/worker/heartbeat"], headers=bearer(other))
    assert beats.json()["running"][0]["renewed"] is False
    stolen = await http.post("/v1/worker/finish", json=bodies["/v1/worker/finish"], headers=bearer(other))
    assert stolen.json()["outcomes"][0]["accepted"] is False
    assert (await execution(stores, messages[0]))["state"] == "RUNNING"

    # Bad input names its field.
    bad = await http.post("/v1/worker/pull", json={"session": "x", "max": 0}, headers=bearer(token))
    assert bad.status_code == 422 and {e["field"] for e in bad.json()["errors"]} == {"session", "max"}

    # The token refreshes: the same registry entry, a later expiry; and the owner's work still finishes with it.
    refreshed = await http.post("/v1/worker/token", headers=bearer(token))
    assert refreshed.status_code == 200, refreshed.text
    done = await http.post(
        "/v1/worker/finish", json=bodies["/v1/worker/finish"], headers=bearer(refreshed.json()["token"])
    )
    assert done.json()["outcomes"][0]["accepted"] is True


@pytest.mark.parametrize("gateway", [{"gateway_rate_per_token": 3, "gateway_max_result_bytes": 1024}], indirect=True)
async def test_sizes_and_request_rates_are_capped(
    gateway: tuple[httpx.AsyncClient, Any], stores: Stores, publisher: KafkaPublisher, database_url: str
) -> None:
    http, _ = gateway
    pool = admit(database_url, f"gw-{uuid.uuid4().hex[:8]}", TENANT)
    token = await pool_token(stores, pool)
    outcome = {"executionId": str(uuid.uuid4()), "attempt": 1, "attemptToken": "x", "state": "SUCCEEDED"}
    big = {"session": "session-one", "outcomes": [{**outcome, "result": "x" * 2000}]}
    refused = await http.post("/v1/worker/finish", json=big, headers=bearer(token))
    assert refused.status_code == 422, refused.text
    assert refused.json()["errors"][0]["field"] == "outcomes[0].result" and "1024" in refused.json()["detail"]
    statuses = [
        (await http.post("/v1/worker/pull", json={"session": "session-one", "waitMs": 0}, headers=bearer(token)))
        for _ in range(6)
    ]
    limited = [r for r in statuses if r.status_code == 429]
    assert limited and int(limited[0].headers["Retry-After"]) >= 1, [r.status_code for r in statuses]
    assert "requests a second" in limited[0].json()["detail"]


@pytest.mark.parametrize("gateway", [{"gateway_test_pause_at": "pull", "gateway_test_pause_sec": 4}], indirect=True)
async def test_concurrent_pulls_of_one_pool_are_not_served_one_after_another(
    gateway: tuple[httpx.AsyncClient, Any], stores: Stores, publisher: KafkaPublisher, database_url: str
) -> None:
    http, app = gateway
    pool = admit(database_url, f"gwc-{uuid.uuid4().hex[:8]}", TENANT)
    token = await pool_token(stores, pool)
    await publish(publisher, await dispatch(stores, pool, "echo", [{"n": n} for n in range(4)], tenant=TENANT))

    def pull(session: str) -> Any:
        body = {"session": session, "max": 2, "waitMs": 10_000}
        return http.post("/v1/worker/pull", json=body, headers=bearer(token))

    # The first pull takes messages and is held there (the test hook) before their start ...
    first = asyncio.create_task(pull("session-held"))
    hook = app.state.gateway.hook

    async def held() -> bool:
        return bool(hook.fired)

    await wait_until(held, "the first pull to be held after its take", within=30)
    # ... while another session's pulls of the same pool take and start the rest, and are answered first. A pull
    # answers with what its feed has fetched so far, so on a loaded machine the rest may come in two answers.
    began = time.monotonic()
    served: list[Any] = []
    while len(served) < 2 and time.monotonic() - began < 4:
        second = await pull("session-free")
        assert second.status_code == 200, second.text
        served += second.json()["executions"]
    assert len(served) >= 2 and not first.done() and time.monotonic() - began < 4, served
    answer = await first
    held_back = answer.json()["executions"]
    assert held_back, answer.text
    # The held pull took what its feed had fetched when it came (one or both of its two); whatever is left goes to
    # the next pull. Every execution is served once, to one of the two sessions.
    while len(held_back) + len(served) < 4 and time.monotonic() - began < 30:
        served += (await pull("session-free")).json()["executions"]
    ids = [e["executionId"] for e in held_back + served]
    assert len(ids) == len(set(ids)) == 4, ids
