"""How a test builds an execution's Kafka message (``execution_message("demo")``) and reads a received one's
headers (``header(message, "tenant")``).

A message of ``pool`` with fresh ids and the fields a first attempt has; any field may be given
(``execution_message("demo", tenant_id="acme")``). For tests whose subject is the message's route (topic
wake-ups, publishers), not the execution behind it: nothing is written anywhere.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Message
from sundial_common.broker.messages import ExecutionMessage
from sundial_common.domain.ids import new_id


def execution_message(pool: str, **fields: Any) -> ExecutionMessage:
    values: dict[str, Any] = {
        "execution_id": str(new_id()),
        "job_id": str(new_id()),
        "tenant_id": "t",
        "pool": pool,
        "handler": "echo",
        "attempt": 1,
        "fence_token": 1,
        "scheduled_for": datetime.now(UTC).isoformat(),
        "timeout_sec": 60,
        "payload": None,
    }
    return ExecutionMessage(**{**values, **fields})


def header(message: Message, name: str) -> bytes:
    """The value of a received message's header ``name``; fails the test if it is missing or has no value."""
    headers = message.headers() or []
    pairs = headers.items() if isinstance(headers, dict) else headers
    found = [value for key, value in pairs if key == name]
    assert found and isinstance(found[0], bytes), f"no header {name!r} in {headers!r}"
    return found[0]
