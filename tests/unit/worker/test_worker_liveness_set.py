"""Which executions a worker keeps alive (``InFlight.unsettled_ids``, renewed by the liveness thread): every one it
won until its outcome is written, not only while its handler runs — an outcome waiting for a slow write is still
RUNNING in Postgres, and the sweeper must not take it for a worker that died."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sundial_common.broker.messages import ExecutionMessage
from sundial_worker.inflight import InFlight, Running


def running() -> Running:
    execution_id = uuid.uuid4()
    message = ExecutionMessage(
        str(execution_id), str(uuid.uuid4()), "acme", "default", "echo", 1, 1, datetime.now(UTC).isoformat(), 30, {}
    )
    return Running(execution_id, 1, message, [])


def test_an_ended_handler_keeps_its_execution_alive_until_its_outcome_is_written() -> None:
    inflight = InFlight()
    first, second = running(), running()
    inflight.add(first)
    inflight.add(second)

    inflight.end(first.execution_id)  # the handler returned; its outcome waits for the flusher

    assert sorted(inflight.unsettled_ids()) == sorted([first.execution_id, second.execution_id])
    assert list(inflight.running) == [second.execution_id], "its handler slot is free"
    assert inflight.slot_freed.is_set()

    inflight.settle(first.execution_id)  # written

    assert inflight.unsettled_ids() == [second.execution_id]
