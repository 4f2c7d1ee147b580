"""Sending what a shard leader has just committed outside its dispatch pass (dependency children, backfills).

One publish for the batch; the executions sent are marked published, the others stay for the sweeper to send;
each execution's dispatch span ends saying how its transaction and its publish went.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from uuid import UUID

from opentelemetry.trace import Span, Status, StatusCode
from sundial_common.broker.kafka import Publisher
from sundial_common.broker.messages import ExecutionMessage
from sundial_common.stores.dispatch import DispatchStore


async def publish_committed(
    publisher: Publisher, outbox: DispatchStore, messages: Sequence[ExecutionMessage], spans: Mapping[UUID, Span]
) -> int:
    """Publish ``messages`` of committed executions, mark the sent ones published and end their spans; returns
    how many could not be sent (the sweeper sends them)."""
    errors = await publisher.publish(messages)
    sent: list[UUID] = []
    for message, error in zip(messages, errors, strict=True):
        execution_id = UUID(message.execution_id)
        span = spans[execution_id]
        if error is None:
            sent.append(execution_id)
        else:
            span.set_status(Status(StatusCode.ERROR, f"publish failed: {error}"))
        span.end()
    await outbox.mark_published(sent)
    return len(messages) - len(sent)


def end_failed(spans: Mapping[UUID, Span], what: str) -> None:
    """The transaction that would have created these executions failed: their spans end with the error."""
    for span in spans.values():
        span.set_status(Status(StatusCode.ERROR, f"{what} transaction failed"))
        span.end()


def end_duplicates(spans: Mapping[UUID, Span], created: Collection[UUID]) -> None:
    """End the spans of planned executions the transaction did not create (one existed already)."""
    for execution_id, span in spans.items():
        if execution_id not in created:
            span.set_attribute("sundial.duplicate", True)
            span.end()


def end_rate_limited(spans: dict[UUID, Span], execution_ids: Collection[UUID]) -> None:
    """End (and forget) the spans of planned executions left out for want of a dispatch-rate token (they wait)."""
    for execution_id in execution_ids:
        span = spans.pop(execution_id)
        span.set_attribute("sundial.rate_limited", True)
        span.end()
