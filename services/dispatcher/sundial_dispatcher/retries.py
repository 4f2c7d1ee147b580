"""The retry half of a shard's dispatch pass: scheduled retries claimed from the hot window go out again.

A failed attempt (FAILED, TIMED_OUT, FAILED_WORKER_LOST) with attempts left gets ``next_attempt_at`` in
Postgres and a member ``r:<execution id>`` in its shard's hot window, scored at that instant — a delayed
occurrence like a job's next fire, not a separate retry topic: one claim script, one fence, one outbox.
When the leader claims such members it runs the same three steps as for a job: retries are a dispatch source
(:mod:`sundial_dispatcher.sources`):

1. **Claim** — already done by the shared claim; a crash after it loses only Redis members, which the
   hydrator's overdue scan puts back from ``next_attempt_at``.
2. **Commit** — one transaction raises the shard fence to this term's token (a paused ex-leader is
   rejected) and compare-and-swaps each due retry from its failed state to PENDING
   with ``attempt + 1`` and this term's token. A member whose execution was cancelled or has
   already been retried matches nothing; one that raced ahead of a re-scheduled retry goes back at the
   right score. Retries of a handler whose circuit breaker is OPEN are **held** in the same transaction
   (:func:`sundial_common.stores.breakers.gate_retries`): not attempted, their attempt number unchanged,
   their ``next_attempt_at`` moved to the breaker's next probe (they come back as misplaced members at
   that score); a HALF_OPEN breaker lets its few probes through.
3. **Send** the next attempts to their pools' topics through the outbox sender, which marks them published. A
   crash before that leaves PENDING rows the sweeper republishes. A worker still holding the previous attempt
   loses every compare-and-swap: its attempt number is no longer the execution's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from opentelemetry.trace import Span
from sundial_common.broker.messages import ExecutionMessage, pool_topic
from sundial_common.broker.outbox import OutboxSender
from sundial_common.hotwindow.window import HotWindow
from sundial_common.observability.tracing import (
    execution_send_span,
    traceparent,
)
from sundial_common.runtime.clock import Clock
from sundial_common.runtime.crashpoints import crash_point
from sundial_common.stores.dispatch import DispatchStore, RetryDispatch
from sundial_common.stores.types import Record, RetryDue

from sundial_dispatcher.metrics import count_dispatched
from sundial_dispatcher.sources import dispatch_once

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
    """Leader-only: one shard's claimed retry members as a dispatch source (:mod:`sundial_dispatcher.sources`),
    under one term's fencing token (its outbox sender's)."""

    def __init__(
        self,
        shard: int,
        holder: str,
        store: DispatchStore,
        hot_window: HotWindow,
        outbox: OutboxSender,
        clock: Clock,
        hot_window_sec: int,
        claims: Sequence[RetryDue],
        *,
        ahead: bool = False,
    ) -> None:
        self.shard = shard
        self.holder = holder
        self.store = store
        self.hot_window = hot_window
        self.outbox = outbox
        self.clock = clock
        self.hot_window_sec = hot_window_sec
        #: The retry members the shard's pass claimed with its jobs.
        self.claims = claims
        #: Retries are claimed up to the publish lead before they are due: their messages carry the due instant.
        self.ahead = ahead

    async def dispatch(self) -> RetryResult:
        """Commit (fenced) and send the next attempt of each claimed retry. Raises ``FencedOut`` like a dispatch."""
        return await dispatch_once(self)

    async def claim(self) -> Sequence[RetryDue] | None:
        return self.claims or None

    async def put_back(self, claimed: Sequence[RetryDue]) -> None:
        """Nothing of its own: the shard's pass that claimed these with its jobs puts the whole claim back."""

    def nothing(self) -> RetryResult:
        return RetryResult()

    async def commit(self, claimed: Sequence[RetryDue]) -> RetryDispatch:
        outcome = await self.store.dispatch_retries(self.shard, self.outbox.fence_token, self.holder, claimed)
        crash_point("dispatcher.after_commit")
        if outcome.misplaced:
            horizon = self.clock.now() + timedelta(seconds=self.hot_window_sec)
            await self.hot_window.add_retries(
                self.shard, [r for r in outcome.misplaced if r.due < horizon], only_new=True
            )
        if outcome.held:
            log.info("shard %d: %d retries held by open circuit breakers", self.shard, outcome.held)
        return outcome

    async def send(self, outcome: RetryDispatch) -> RetryResult:
        if not outcome.dispatched:
            return RetryResult(held=outcome.held)
        count_dispatched((row["tenant_id"], row["pool"]) for row in outcome.dispatched)
        messages: list[ExecutionMessage] = []
        spans: list[Span | None] = []
        now = self.clock.now()
        due = {c.execution_id: c.due for c in self.claims if self.ahead and c.due > now}
        for row in outcome.dispatched:
            # Each attempt gets a dispatch span in the execution's own trace, as the first one did, and the
            # handler's span continues it: every attempt of one occurrence is one story.
            span = execution_send_span(
                row, pool_topic(row["pool"]), {"sundial.retry": True, "sundial.fence_token": self.outbox.fence_token}
            )
            spans.append(span)
            messages.append(self._message(row, traceparent(span) or row["traceparent"], due.get(row["id"])))
        ids = [row["id"] for row in outcome.dispatched]
        sent = await self.outbox.send(messages, ids, spans, mark=self.store.mark_published)
        if sent.failed:
            # Not lost: they are PENDING and unpublished, and the sweeper sends them again.
            log.warning("shard %d: %d retry publishes failed; the sweeper will send them", self.shard, sent.failed)
        return RetryResult(
            retried=len(messages),
            published=len(sent.sent),
            publish_failed=sent.failed,
            held=outcome.held,
            probes=outcome.probes,
        )

    def _message(self, row: Record, parent: str | None, due: datetime | None) -> ExecutionMessage:
        return ExecutionMessage(
            execution_id=str(row["id"]),
            job_id=str(row["job_id"]),
            tenant_id=row["tenant_id"],
            pool=row["pool"],
            handler=row["handler"],
            attempt=row["attempt"],
            fence_token=self.outbox.fence_token,
            scheduled_for=row["scheduled_for"].isoformat(),
            timeout_sec=row["timeout_sec"],
            payload=row["payload"],
            traceparent=parent,
            due_at=due.isoformat() if due is not None else None,
        )
