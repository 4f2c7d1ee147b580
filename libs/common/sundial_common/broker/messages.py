"""What travels on Kafka: topic names and the execution message codec.

A message has no key (a published batch goes to one partition: :class:`~sundial_common.broker.kafka.KafkaPublisher`)
and carries execution id, attempt, fence token, tenant and the W3C ``traceparent`` as headers, so a
consumer can route, dedupe and continue the trace without decoding the body.

A message with no value at all is a **marker**: the sweeper appends one to a quiet partition of a pool's topic so that
the pool's consumer group can be seen to pass everything appended before it (:mod:`sundial_sweeper.consumed`). It
names no execution; a worker acknowledges it and runs nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

import orjson

POOL_TOPIC_PREFIX = "sundial.pool."
DLQ_TOPIC = "sundial.dlq"
POOL_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


def pool_topic(pool: str) -> str:
    return POOL_TOPIC_PREFIX + pool


def pool_group(pool: str) -> str:
    """The consumer group every worker of a pool shares (each message goes to one of them); the sweeper reads its
    committed offsets (:mod:`sundial_sweeper.consumed`)."""
    return POOL_TOPIC_PREFIX + pool


@dataclass(frozen=True, slots=True)
class ExecutionMessage:
    execution_id: str
    job_id: str
    tenant_id: str
    pool: str
    handler: str
    attempt: int
    fence_token: int
    scheduled_for: str  # ISO 8601 UTC
    timeout_sec: int
    payload: Any
    traceparent: str | None = None
    #: Published ahead of its due instant (ISO 8601 UTC): the worker holds it until then (sundial_worker.holding).
    #: None: due already. A worker older than this field ignores it and starts the message on receipt, so workers
    #: are upgraded before dispatchers publish ahead (``SUNDIAL_DISPATCHER_PUBLISH_LEAD_MS``).
    due_at: str | None = None

    @property
    def topic(self) -> str:
        return pool_topic(self.pool)

    def encode(self) -> bytes:
        return orjson.dumps(self)  # orjson serialises dataclasses natively (no deep copy)

    def headers(self) -> list[tuple[str, str | bytes | None]]:
        headers: list[tuple[str, str | bytes | None]] = [
            ("execution_id", self.execution_id.encode()),
            ("attempt", str(self.attempt).encode()),
            ("fence_token", str(self.fence_token).encode()),
            ("tenant", self.tenant_id.encode()),
        ]
        if self.traceparent:
            headers.append(("traceparent", self.traceparent.encode()))
        return headers

    @classmethod
    def decode(cls, value: bytes) -> ExecutionMessage:
        # Unknown keys are ignored so that a newer dispatcher can add fields during a rolling deploy.
        data = orjson.loads(value)
        # The usual case, a body with no key to drop, skips the filtering copy (a worker decodes every message).
        if type(data) is dict and data.keys() <= _FIELDS:
            return cls(**data)
        return cls(**{name: data[name] for name in _FIELDS if name in data})


_FIELDS = frozenset(f.name for f in fields(ExecutionMessage))


@dataclass(frozen=True, slots=True)
class DeadLetter(ExecutionMessage):
    """An execution that used up its attempts (DEAD), as published to ``sundial.dlq`` for someone to look at.

    It carries what its last attempt carried plus why it died, so a consumer of the topic (an alerting
    hook, an ops dashboard) needs nothing else; ``POST /v1/executions/{id}/retry`` runs it once more.
    """

    error: str | None = None
    max_attempts: int = 0
    job_name: str | None = None
    finished_at: str | None = None  # ISO 8601 UTC
    trace_id: str | None = None

    @property
    def topic(self) -> str:
        return DLQ_TOPIC
