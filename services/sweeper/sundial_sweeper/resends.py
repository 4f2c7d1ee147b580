"""What the sweeper sends again about an execution: its message rebuilt from its row and the PRODUCER span in the
execution's own trace (the outbox sender, :class:`sundial_common.broker.outbox.OutboxSender`, sends the message and
ends the span)."""

from __future__ import annotations

from datetime import UTC, datetime

from opentelemetry.trace import Span
from sundial_common.broker.messages import DLQ_TOPIC, ExecutionMessage, pool_topic
from sundial_common.observability.tracing import (
    FAILURE,
    execution_send_span,
)
from sundial_common.stores.types import Record


def send_span(row: Record, action: str, topic: str | None = None) -> Span:
    """A PRODUCER span in the execution's own trace for a message the sweeper sends about it."""
    topic = topic or pool_topic(row["pool"])
    # A dead letter reports a failure: exported whatever the sample ratio.
    return execution_send_span(
        row, topic, {"sundial.sweeper.action": action, **({FAILURE: True} if topic == DLQ_TOPIC else {})}
    )


def execution_message(row: Record, parent: str | None) -> ExecutionMessage:
    # Sent again before its due instant (a broker restart right after a publish ahead): the worker still holds it.
    due: datetime | None = row["fire_at"]
    if due is not None and due <= datetime.now(UTC):
        due = None
    return ExecutionMessage(
        execution_id=str(row["id"]),
        job_id=str(row["job_id"]),
        tenant_id=row["tenant_id"],
        pool=row["pool"],
        handler=row["handler"],
        attempt=row["attempt"],
        fence_token=row["fence_token"],
        scheduled_for=row["scheduled_for"].isoformat(),
        timeout_sec=row["timeout_sec"],
        payload=row["payload"],
        traceparent=parent,
        due_at=due.isoformat() if due is not None else None,
    )
