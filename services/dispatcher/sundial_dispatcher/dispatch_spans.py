"""The end of a planned execution's dispatch span when it is never sent: its transaction failed, the occurrence
already had an execution, or it waits for a dispatch-rate token. A sent one's span ends in the outbox sender
(:class:`sundial_common.broker.outbox.OutboxSender`), with how its publish went."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from uuid import UUID

from opentelemetry.trace import Span, Status, StatusCode


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
