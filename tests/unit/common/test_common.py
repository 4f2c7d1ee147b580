"""Pure parts of sundial_common: ids, shard mapping, SQL loading, message codec."""

from __future__ import annotations

import uuid

import orjson
import pytest
from sundial_common.broker.messages import ExecutionMessage, pool_topic
from sundial_common.domain.ids import new_execution_id, new_id, parse_id, shard_for
from sundial_common.runtime.clock import from_ms, to_ms
from sundial_common.stores import database, dispatch, executions, idempotency, jobs
from sundial_common.stores.queries import load


def test_new_ids_are_uuid7_and_time_ordered() -> None:
    ids = [new_id() for _ in range(1000)]
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert len(set(ids)) == 1000
    # Millisecond prefixes never go backwards, so inserts land at the right edge of the index.
    prefixes = [i.int >> 80 for i in ids]
    assert prefixes == sorted(prefixes)


def test_new_ids_are_plain_uuids() -> None:
    # Built without uuid.UUID's constructor: still what it would have made, in every way a caller can see.
    ident = new_id()
    again = uuid.UUID(str(ident))
    assert type(ident) is uuid.UUID and ident == again and hash(ident) == hash(again)
    assert ident.is_safe is uuid.SafeUUID.unknown and ident.bytes == again.bytes
    assert orjson.dumps(ident) == orjson.dumps(again)


def test_execution_ids_are_uuid7_and_time_ordered_c_uuids() -> None:
    ids = [new_execution_id() for _ in range(1000)]
    assert all(isinstance(i, uuid.UUID) and i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert len(set(ids)) == 1000 and all(parse_id(str(i)) == i == uuid.UUID(str(i)) for i in ids)
    prefixes = [i.int >> 80 for i in ids]
    assert prefixes == sorted(prefixes)
    assert new_id().int >> 80 >= prefixes[-1]  # one clock for both kinds


def test_parsed_ids_are_the_uuids_of_their_text() -> None:
    text = "01a1fcb0-15a3-7a79-b54f-dccab6a1ddea"
    parsed, stdlib = parse_id(text), uuid.UUID(text)
    assert isinstance(parsed, uuid.UUID) and parsed == stdlib and stdlib == parsed
    assert hash(parsed) == hash(stdlib) and {stdlib: 1}[parsed] == 1
    assert str(parsed) == text and parsed.version == 7 and parsed.int == stdlib.int
    assert parse_id(text.replace("-", "")) == stdlib
    for bad in ("", "01a1fcb0", text + "0", text[:-1] + "g"):
        with pytest.raises(ValueError):
            parse_id(bad)


def test_shard_mapping_is_stable_and_spread() -> None:
    job = uuid.UUID("01a1fcb0-15a3-7a79-b54f-dccab6a1ddea")
    assert shard_for(job, 8) == shard_for(uuid.UUID(str(job)), 8)
    counts = [0] * 8
    for _ in range(8000):
        counts[shard_for(uuid.uuid4(), 8)] += 1
    assert min(counts) > 800  # ~1000 each; a broken hash would pile them up


def test_every_named_query_is_loaded_once() -> None:
    Q = {**database.Q, **jobs.Q, **executions.Q, **dispatch.Q, **idempotency.Q}
    assert {"insert_job", "raise_fence", "lock_due_jobs", "start_executions", "finish_executions"} <= set(Q)
    with pytest.raises(ValueError, match="twice"):
        load("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")


def test_epoch_ms_round_trip() -> None:
    instant = from_ms(1_790_000_000_123)
    assert to_ms(instant) == 1_790_000_000_123


def test_execution_message_round_trips_with_headers() -> None:
    message = ExecutionMessage(
        execution_id="e1",
        job_id="j1",
        tenant_id="acme",
        pool="demo",
        handler="echo",
        attempt=2,
        fence_token=77,
        scheduled_for="2026-11-21T10:00:00+00:00",
        timeout_sec=30,
        payload={"a": [1, 2]},
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    assert ExecutionMessage.decode(message.encode()) == message
    assert message.topic == pool_topic("demo") == "sundial.pool.demo"
    headers = dict(message.headers())
    assert headers["fence_token"] == b"77" and headers["attempt"] == b"2" and headers["tenant"] == b"acme"
    assert headers["traceparent"] == message.traceparent.encode()  # type: ignore[union-attr]


def test_execution_message_ignores_fields_it_does_not_know() -> None:
    """A newer dispatcher may add fields during a rolling deploy; older workers must still decode."""
    import orjson

    raw = orjson.loads(
        ExecutionMessage(
            execution_id="e1",
            job_id="j1",
            tenant_id="acme",
            pool="demo",
            handler="echo",
            attempt=1,
            fence_token=1,
            scheduled_for="2026-11-21T10:00:00+00:00",
            timeout_sec=30,
            payload={},
        ).encode()
    )
    raw["added_later"] = 1
    assert ExecutionMessage.decode(orjson.dumps(raw)).execution_id == "e1"
