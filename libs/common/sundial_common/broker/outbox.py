"""The outbox sender: the one way an execution's message leaves for the broker.

The execution row is the outbox: it is committed before anything is sent, so a message that is never sent is not
lost (the sweeper sends again what stayed PENDING and unpublished). Every send of an execution's message — a shard
leader's first attempts, retries, dependent children and backfill occurrences, the sweeper's republishes and dead
letters — goes through :meth:`OutboxSender.send`, which

* publishes the batch (one produce call, one answer per message);
* ends each message's PRODUCER span with how its publish went (an error status on a failed one);
* counts the messages sent and failed per sender (``sundial_outbox_messages_total{sender, outcome}``);
* records the sent ones back in Postgres (``mark``: published, republished or dead-lettered, as the caller's store
  names it), or leaves that to the caller (a shard leader marks its first attempts a moment later, in groups).

A sender made for a shard leader's term carries the term's fencing token (:attr:`OutboxSender.fence_token`): the
messages of that term are stamped with it, so a worker can tell a deposed leader's message from its successor's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from uuid import UUID

from opentelemetry.trace import Span, Status, StatusCode
from prometheus_client import Counter

from sundial_common.broker.kafka import Publisher
from sundial_common.broker.messages import ExecutionMessage
from sundial_common.observability.metrics import REGISTRY

__all__ = ["OUTBOX_MESSAGES", "Mark", "OutboxSender", "Sent"]

OUTBOX_MESSAGES = Counter(
    "sundial_outbox_messages",
    "Execution messages handed to the broker, by sender (dispatch, retry, trigger, backfill, republish, dead_letter) "
    "and outcome (sent: acknowledged; failed: left in the outbox for the sweeper).",
    ["sender", "outcome"],
    registry=REGISTRY,
)

#: Records executions whose messages the broker acknowledged (``DispatchStore.mark_published`` and the like).
Mark = Callable[[Sequence[UUID]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Sent:
    """What one :meth:`OutboxSender.send` did."""

    #: The executions whose messages the broker acknowledged, in the batch's order.
    sent: list[UUID]
    #: Messages the broker did not take (they stay in the outbox).
    failed: int
    #: The first publish error, for the caller's log line (None: all sent).
    first_error: Exception | None = None


class OutboxSender:
    """Publishes committed executions' messages for one ``sender`` (see the module docstring)."""

    def __init__(self, publisher: Publisher, sender: str, fence_token: int = 0) -> None:
        self.publisher = publisher
        self.sender = sender
        #: The fencing token of the term whose messages this sender sends (0: none, each message carries its own).
        self.fence_token = fence_token
        self._sent = OUTBOX_MESSAGES.labels(sender, "sent")
        self._failed = OUTBOX_MESSAGES.labels(sender, "failed")

    async def send(
        self,
        messages: Sequence[ExecutionMessage],
        ids: Sequence[UUID],
        spans: Sequence[Span | None] = (),
        mark: Mark | None = None,
    ) -> Sent:
        """Publish ``messages`` (of the executions ``ids``, in order); end ``spans`` (one per message, None where
        none is recorded; or none at all) with how each publish went; count them; ``mark`` the sent ones. A failed
        message is not retried here: it stays in the outbox."""
        if not messages:
            return Sent([], 0)
        errors = await self.publisher.publish(messages)
        if spans:
            for span, error in zip(spans, errors, strict=True):
                if span is None:
                    continue
                if error is not None:
                    span.set_status(Status(StatusCode.ERROR, f"publish failed: {error}"))
                span.end()
        sent = [execution_id for execution_id, error in zip(ids, errors, strict=True) if error is None]
        failed = len(messages) - len(sent)
        self._sent.inc(len(sent))
        if failed:
            self._failed.inc(failed)
        if mark is not None and sent:
            await mark(sent)
        return Sent(sent, failed, next((e for e in errors if e is not None), None))
