"""The idempotency store's contract: a key is claimed by one request at a time, answered with the jobs it created
in the same write or not at all, released for a retry, taken over only when its claim is abandoned by the same
body or its lifetime is over, and purged once expired."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sundial_common.stores.idempotency import IdempotentResponse
from sundial_common.stores.types import Record

from tests.contracts.jobs import Jobs, ids, one_shot

NOW = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)
BODY = b"sha256 of the body"


def created(row: Record) -> IdempotentResponse:
    return IdempotentResponse(201, {"location": f"/v1/jobs/{row['id']}"}, b'{"ok": true}', row["id"])


async def test_a_claimed_key_answers_its_retries_with_the_job_created_once(jobs: Jobs) -> None:
    keys = jobs.idempotency
    token = uuid.uuid4()
    assert await keys.claim_idempotency_key("acme", "k1", BODY, token, 30, 3600)
    assert not await keys.claim_idempotency_key("acme", "k1", BODY, uuid.uuid4(), 30, 3600), "one request at a time"
    in_flight = await keys.get_idempotency_key("acme", "k1")
    assert in_flight is not None and (in_flight["state"], in_flight["status_code"]) == ("IN_FLIGHT", None)
    assert in_flight["lock_expired"] is False and in_flight["request_hash"] == BODY

    values = one_shot(NOW)
    done = await keys.insert_job_idempotent(values, "alice", key="k1", token=token, respond=created)
    assert done is not None
    row, response = done
    assert row["id"] == values["id"] and await jobs.store.get_job("acme", values["id"]) == row
    answered = await keys.get_idempotency_key("acme", "k1")
    assert answered is not None
    assert (answered["state"], answered["status_code"], answered["resource_id"]) == ("DONE", 201, values["id"])
    assert (answered["headers"], bytes(answered["body"])) == (response.headers, response.body)
    assert answered["lock_expired"] is None, "an answered key holds no lock"
    assert await keys.get_idempotency_key("globex", "k1") is None, "keys are per tenant"

    again = one_shot(NOW)
    assert await keys.insert_job_idempotent(again, "alice", key="k1", token=token, respond=created) is None
    assert await jobs.store.get_job("acme", again["id"]) is None, "an answered key creates nothing more"


async def test_a_batch_and_its_answer_are_written_together_or_not_at_all(jobs: Jobs) -> None:
    keys = jobs.idempotency
    token = uuid.uuid4()
    await keys.claim_idempotency_key("acme", "batch", BODY, token, 30, 3600)
    batch = [one_shot(NOW) for _ in range(3)]

    def broken(rows: list[Record]) -> IdempotentResponse:
        raise RuntimeError("the response could not be rendered")

    with pytest.raises(RuntimeError):
        await keys.insert_jobs_idempotent(batch, "a", tenant_id="acme", key="batch", token=token, respond=broken)
    assert [await jobs.store.get_job("acme", job["id"]) for job in batch] == [None] * 3

    def answer(rows: list[Record]) -> IdempotentResponse:
        return IdempotentResponse(200, {}, b"[]", None)

    done = await keys.insert_jobs_idempotent(batch, "a", tenant_id="acme", key="batch", token=token, respond=answer)
    assert done is not None and ids(done[0]) == [job["id"] for job in batch]


async def test_a_released_or_abandoned_claim_lets_a_retry_run(jobs: Jobs) -> None:
    keys = jobs.idempotency
    first = uuid.uuid4()
    await keys.claim_idempotency_key("acme", "k2", BODY, first, 30, 3600)
    await keys.release_idempotency_key("acme", "k2", uuid.uuid4())  # not its claim: kept
    assert await keys.get_idempotency_key("acme", "k2") is not None
    await keys.release_idempotency_key("acme", "k2", first)
    assert await keys.get_idempotency_key("acme", "k2") is None

    second = uuid.uuid4()
    assert await keys.claim_idempotency_key("acme", "k2", BODY, second, 0.05, 3600)
    await asyncio.sleep(0.1)  # its request died: the claim's lock runs out
    stale = await keys.get_idempotency_key("acme", "k2")
    assert stale is not None and stale["lock_expired"] is True
    assert not await keys.claim_idempotency_key("acme", "k2", b"another body", uuid.uuid4(), 30, 3600)
    third = uuid.uuid4()
    assert await keys.claim_idempotency_key("acme", "k2", BODY, third, 30, 3600), "the same body takes it over"
    late = one_shot(NOW)
    assert await keys.insert_job_idempotent(late, "a", key="k2", token=second, respond=created) is None
    assert await jobs.store.get_job("acme", late["id"]) is None, "the request that lost its claim writes nothing"


async def test_expired_keys_are_forgotten_and_purged(jobs: Jobs) -> None:
    keys = jobs.idempotency
    for key in ("old-1", "old-2"):
        await keys.claim_idempotency_key("acme", key, BODY, uuid.uuid4(), 30, 0.05)
    await keys.claim_idempotency_key("acme", "fresh", BODY, uuid.uuid4(), 30, 3600)
    await asyncio.sleep(0.1)
    assert await keys.get_idempotency_key("acme", "old-1") is None, "past its lifetime it answers nothing"
    assert await keys.claim_idempotency_key("acme", "old-1", b"any body", uuid.uuid4(), 30, 3600)
    assert await keys.purge_idempotency_keys(10) == 1
    assert await keys.purge_idempotency_keys(10) == 0
    assert await keys.get_idempotency_key("acme", "fresh") is not None
