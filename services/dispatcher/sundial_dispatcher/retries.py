"""The retry half of a shard's dispatch pass: scheduled retries claimed from the hot window go out again.

A failed attempt (FAILED, TIMED_OUT, FAILED_WORKER_LOST) with attempts left gets ``next_attempt_at`` in
Postgres and a member ``r:<execution id>`` in its shard's hot window, scored at that instant — a delayed
occurrence like a job's next fire, not a separate retry topic: one claim script, one fence, one outbox.
When the leader claims such members it runs the same three steps as for a job (see
:mod:`sundial_dispatcher.dispatcher`):

1. **Claim** — already done by the shared claim; a crash after it loses only Redis members, which the
   hydrator's overdue scan puts back from ``next_attempt_at``.
2. **Commit** — one transaction raises the shard fence to this term's token (a paused ex-leader is
   rejected, DESIGN invariant 4) and compare-and-swaps each due retry from its failed state to PENDING
   with ``attempt + 1`` and this term's token (invariant 3). A member whose execution was cancelled or has
   already been retried matches nothing; one that raced ahead of a re-scheduled retry goes back at the
   right score. Retries of a handler whose circuit breaker is OPEN are **held** in the same transaction
   (:func:`sundial_common.stores.breakers.gate_retries`): not attempted, their attempt number unchanged,
   their ``next_attempt_at`` moved to the breaker's next probe (they come back as misplaced members at
   that score); a HALF_OPEN breaker lets its few probes through.
3. **Publish** the next attempts to their pools' topics, then mark them published. A crash before that
   leaves PENDING rows the sweeper republishes. A worker still holding the previous attempt loses every
   compare-and-swap: its attempt number is no longer the execution's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from sundial_common.broker.kafka import Publisher
from sundial_common.broker.messages import ExecutionMessage, pool_topic
from sundial_common.hotwindow.window import HotWindow
from sundial_common.observability.tracing import (
    execution_attributes,
    execution_context,
    kafka_publish_attributes,
    traceparent,
    tracer,
)
from sundial_common.runtime.clock import Clock
from sundial_common.runtime.crashpoints import crash_point
from sundial_common.stores.dispatch import DispatchStore
from sundial_common.stores.types import Record, RetryDue

from sundial_dispatcher.metrics import count_dispatched

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryResult:
    #: Executions moved to their next attempt.
    retried: int = 0
    published: int = 0
    publish_failed: int = 0
    #: Claimed retries an open breaker held (back in the hot window at the breaker's next probe).
    held: int = 0
    #: Retries a half-open breaker let through as probes (among ``retried``).
    probes: int = 0


class RetryDispatcher:
    """Leader-only: dispatch one shard's claimed retry members under one term's fencing token."""

    def __init__(
        self,
        shard: int,
        token: int,
        holder: str,
        store: DispatchStore,
        hot_window: HotWindow,
        publisher: Publisher,
        clock: Clock,
        hot_window_sec: int,
        *,
        ahead: bool = False,
    ) -> None:
        self.shard = shard
        self.token = token
        self.holder = holder
        self.store = store
        self.hot_window = hot_window
        self.publisher = publisher
        self.clock = clock
        self.hot_window_sec = hot_window_sec
        #: Retries are claimed up to the publish lead before they are due: their messages carry the due instant.
        self.ahead = ahead

    async def dispatch(self, claims: Sequence[RetryDue]) -> RetryResult:
        """Commit (fenced) and publish the next attempt of each due retry. Raises ``FencedOut`` like a dispatch."""
        if not claims:
            return RetryResult()
        outcome = await self.store.dispatch_retries(self.shard, self.token, self.holder, claims)
        crash_point("dispatcher.after_commit")
        if outcome.misplaced:
            horizon = self.clock.now() + timedelta(seconds=self.hot_window_sec)
            await self.hot_window.add_retries(
                self.shard, [r for r in outcome.misplaced if r.due < horizon], only_new=True
            )
        if outcome.held:
            log.info("shard %d: %d retries held by open circuit breakers", self.shard, outcome.held)
        if not outcome.dispatched:
            return RetryResult(held=outcome.held)
        count_dispatched((row["tenant_id"], row["pool"]) for row in outcome.dispatched)
        messages: list[ExecutionMessage] = []
        spans: list[Span] = []
        now = self.clock.now()
        due = {c.execution_id: c.due for c in claims if self.ahead and c.due > now}
        for row in outcome.dispatched:
            # Each attempt gets a dispatch span in the execution's own trace, as the first one did, and the
            # handler's span continues it: every attempt of one occurrence is one story.
            span = tracer.start_span(
                f"send {pool_topic(row['pool'])}",
                context=execution_context(row["traceparent"]),
                kind=SpanKind.PRODUCER,
                attributes={
                    **execution_attributes(
                        tenant=row["tenant_id"],
                        job_id=row["job_id"],
                        execution_id=row["id"],
                        attempt=row["attempt"],
                        pool=row["pool"],
                        handler=row["handler"],
                    ),
                    **kafka_publish_attributes(pool_topic(row["pool"]), str(row["id"])),
                    "sundial.retry": True,
                    "sundial.fence_token": self.token,
                },
            )
            spans.append(span)
            messages.append(self._message(row, traceparent(span) or row["traceparent"], due.get(row["id"])))
        errors = await self.publisher.publish(messages)
        for span, error in zip(spans, errors, strict=True):
            if error is not None:
                span.set_status(Status(StatusCode.ERROR, f"publish failed: {error}"))
            span.end()
        sent = [row["id"] for row, error in zip(outcome.dispatched, errors, strict=True) if error is None]
        failed = len(messages) - len(sent)
        if failed:
            # Not lost: they are PENDING and unpublished, and the sweeper sends them again.
            log.warning("shard %d: %d retry publishes failed; the sweeper will send them", self.shard, failed)
        await self.store.mark_published(sent)
        return RetryResult(
            retried=len(messages), published=len(sent), publish_failed=failed, held=outcome.held, probes=outcome.probes
        )

    def _message(self, row: Record, parent: str | None, due: datetime | None) -> ExecutionMessage:
        return ExecutionMessage(
            execution_id=str(row["id"]),
            job_id=str(row["job_id"]),
            tenant_id=row["tenant_id"],
            pool=row["pool"],
            handler=row["handler"],
            attempt=row["attempt"],
            fence_token=self.token,
            scheduled_for=row["scheduled_for"].isoformat(),
            timeout_sec=row["timeout_sec"],
            payload=row["payload"],
            traceparent=parent,
            due_at=due.isoformat() if due is not None else None,
        )
