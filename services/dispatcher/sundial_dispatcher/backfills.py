"""Backfills: the shard leader creates the executions of a recurring job's past occurrences, at a bounded rate.

``POST /v1/jobs/{id}:backfill`` records a durable backfill (:mod:`sundial_common.stores.backfills`); while it
leads the job's shard, the leader runs :meth:`BackfillDispatcher.run_once` beside its dispatch passes (at most
every ``interval_sec``). Each run is one fenced transaction over the shard's running backfills: for each, the
next nominal times after its cursor — as many as its rate allows since its last step (``ratePerSec`` ×
elapsed, the elapsed time capped so that a leader coming back after an outage does not burst), or one at a
time under ``BUFFER_ONE`` once the previous one has ended — become executions, unless the occurrence already
has one (``(job_id, scheduled_for)`` is unique); the cursor moves in the same transaction. Then they are
published, as any dispatch; a crash before that leaves PENDING rows the sweeper sends.

A leader killed mid-backfill loses nothing and doubles nothing: the next one continues from the committed
cursor, and an occurrence committed by the dead one is found taken.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, get_current_span
from sundial_common.broker import Publisher
from sundial_common.clock import Clock, SystemClock
from sundial_common.crashpoints import crash_point
from sundial_common.ids import new_id
from sundial_common.messages import ExecutionMessage, pool_topic
from sundial_common.schedules import occurrences, spec_from_row
from sundial_common.stores.backfills import BackfillAdvance, BackfillExecution, BackfillPlan, BackfillStore
from sundial_common.stores.dispatch import DispatchStore
from sundial_common.stores.types import Record
from sundial_common.telemetry import (
    context_from,
    execution_attributes,
    kafka_publish_attributes,
    trace_id_hex,
    traceparent,
    tracer,
)

from sundial_dispatcher.metrics import count_dispatched
from sundial_dispatcher.publishing import end_duplicates, end_failed, publish_committed

log = logging.getLogger(__name__)

_BEFORE = timedelta(microseconds=1)


@dataclass(frozen=True)
class BackfillConfig:
    #: Seconds between steps of the shard's running backfills.
    interval_sec: float = 0.2
    #: While no backfill runs on the shard, the interval doubles up to this: an idle leader's cost, and how long
    #: a new backfill may wait for its first step.
    idle_interval_sec: float = 1.0
    #: Running backfills stepped per transaction.
    batch_backfills: int = 100
    #: Most executions one backfill creates per step, whatever its rate.
    max_per_step: int = 1000
    #: A step spends at most this many seconds of rate budget (no burst after an outage).
    max_budget_sec: float = 1.0

    def __post_init__(self) -> None:
        if self.interval_sec <= 0 or self.max_budget_sec <= 0:
            raise ValueError("interval_sec and max_budget_sec must be > 0")
        if not 1 <= self.batch_backfills <= 10000 or not 1 <= self.max_per_step <= 10000:
            raise ValueError("batch_backfills and max_per_step must be within 1..10000")


@dataclass
class BackfillResult:
    created: int = 0
    published: int = 0
    publish_failed: int = 0
    #: Running backfills the step looked at (0: none runs on this shard).
    running: int = 0


@dataclass
class _Planner:
    config: BackfillConfig
    spans: dict[UUID, Span] = field(default_factory=dict)
    running: int = 0

    def __call__(self, running: Sequence[Record]) -> BackfillPlan:
        self.running = len(running)
        plan = BackfillPlan()
        for backfill in running:
            budget = self._budget(backfill)
            if budget < 1:
                continue  # its budget is not spent: stepped_at stays, the budget keeps growing
            after = backfill["cursor_at"] or backfill["range_from"] - _BEFORE
            batch: list[datetime] = []
            done = True
            for nominal in occurrences(spec_from_row(backfill), after):
                if nominal >= backfill["range_to"]:
                    break
                batch.append(nominal)
                if len(batch) >= budget:
                    done = False  # the next step finds out whether anything is left
                    break
            plan.executions += [self._execution(backfill, n) for n in batch]
            cursor = batch[-1] if batch else backfill["cursor_at"]
            plan.advances.append(BackfillAdvance(backfill["id"], cursor, 0, done))
        return plan

    def _budget(self, backfill: Record) -> int:
        if backfill["overlap_policy"] == "BUFFER_ONE":
            return 0 if backfill["open"] else 1
        elapsed = min((backfill["db_now"] - backfill["stepped_at"]).total_seconds(), self.config.max_budget_sec)
        return min(int(backfill["rate_per_sec"] * elapsed), self.config.max_per_step)

    def _execution(self, backfill: Record, nominal: datetime) -> BackfillExecution:
        execution_id = new_id()
        origin = context_from(backfill["traceparent"])
        links = [Link(get_current_span(origin).get_span_context())] if origin else []
        span = tracer.start_span(
            f"send {pool_topic(backfill['pool'])}",
            context=Context(),
            kind=SpanKind.PRODUCER,
            links=links,
            attributes={
                **execution_attributes(
                    tenant=backfill["tenant_id"],
                    job_id=backfill["job_id"],
                    execution_id=str(execution_id),
                    attempt=1,
                    pool=backfill["pool"],
                    handler=backfill["handler"],
                ),
                **kafka_publish_attributes(pool_topic(backfill["pool"]), str(execution_id)),
                "sundial.scheduled_for": nominal.isoformat(),
                "sundial.backfill_id": str(backfill["id"]),
            },
        )
        self.spans[execution_id] = span
        policy = backfill["retry_policy"] or {}
        return BackfillExecution(
            execution_id=execution_id,
            backfill=backfill,
            scheduled_for=nominal,
            max_attempts=int(policy.get("maxAttempts", 1)),
            trace_id=trace_id_hex(span),
            traceparent=traceparent(span),
        )


class BackfillDispatcher:
    """Leader-only: one shard's running backfills stepped under one term's fencing token."""

    def __init__(
        self,
        shard: int,
        token: int,
        holder: str,
        store: BackfillStore,
        outbox: DispatchStore,
        publisher: Publisher,
        config: BackfillConfig,
        clock: Clock | None = None,
    ) -> None:
        self.shard = shard
        self.token = token
        self.holder = holder
        self.store = store
        self.outbox = outbox
        self.publisher = publisher
        self.config = config
        self.clock = clock or SystemClock()
        self._next_at = 0.0
        self._interval = self.config.interval_sec
        #: Set by the process's census (:mod:`sundial_dispatcher.side_work`): once its looks are idle, this
        #: leader stops looking on its own and the census says when to look (:meth:`look_now`).
        self.watched = False

    async def run_if_due(self) -> BackfillResult | None:
        """:meth:`run_once` if ``interval_sec`` has passed since the last run (the dispatch loop's hook)."""
        now = self.clock.monotonic()
        if now < self._next_at:
            return None
        result = await self.run_once()
        if result.running:
            self._interval = self.config.interval_sec
        else:  # no backfill runs here
            self._interval = min(self._interval * 2, self.config.idle_interval_sec)
        idle = self._interval >= self.config.idle_interval_sec
        self._next_at = math.inf if idle and self.watched else now + self._interval
        return result

    def look_now(self) -> None:
        """Run on the next pass (the census found work for this shard)."""
        self._next_at = 0.0

    def next_run_in(self) -> float:
        """Seconds until :meth:`run_if_due` runs again (the pass loop sleeps no longer)."""
        return self._next_at - self.clock.monotonic()

    async def run_once(self) -> BackfillResult:
        """One fenced step of every running backfill, then the publishes. Raises ``FencedOut``."""
        planner = _Planner(self.config)
        try:
            outcome = await self.store.step(self.shard, self.token, self.holder, self.config.batch_backfills, planner)
        except BaseException:
            end_failed(planner.spans, "backfill")
            raise
        if outcome.created:
            crash_point("backfills.after_commit")  # committed, not published: the sweeper's to send
        # Planned but not created: the occurrence already had an execution.
        end_duplicates(planner.spans, {p.execution_id for p in outcome.created})
        result = BackfillResult(created=len(outcome.created), running=planner.running)
        if not outcome.created:
            return result
        count_dispatched((p.backfill["tenant_id"], p.backfill["pool"]) for p in outcome.created)
        messages = [self._message(p) for p in outcome.created]
        result.publish_failed = await publish_committed(self.publisher, self.outbox, messages, planner.spans)
        result.published = len(messages) - result.publish_failed
        if result.publish_failed:
            log.warning(
                "shard %d: %d backfill publishes failed; the sweeper will send them", self.shard, result.publish_failed
            )
        return result

    def _message(self, p: BackfillExecution) -> ExecutionMessage:
        b = p.backfill
        return ExecutionMessage(
            execution_id=str(p.execution_id),
            job_id=str(b["job_id"]),
            tenant_id=b["tenant_id"],
            pool=b["pool"],
            handler=b["handler"],
            attempt=1,
            fence_token=self.token,
            scheduled_for=p.scheduled_for.isoformat(),
            timeout_sec=b["timeout_sec"],
            payload=b["payload"],
            traceparent=p.traceparent,
        )
