"""Backfills: the shard leader creates the executions of a recurring job's past occurrences, at a bounded rate.

``POST /v1/jobs/{id}:backfill`` records a durable backfill (:mod:`sundial_common.stores.backfills`); while it
leads the job's shard, the leader runs :meth:`BackfillDispatcher.run_once` beside its dispatch passes (at most
every ``interval_sec``). Each run is one fenced transaction over the shard's running backfills: for each, the
next nominal times after its cursor — as many as its rate allows since its last step (``ratePerSec`` ×
elapsed, the elapsed time capped so that a leader coming back after an outage does not burst), or one at a
time under ``BUFFER_ONE`` once the previous one has ended — become executions, unless the occurrence already
has one (``(job_id, scheduled_for)`` is unique); the cursor moves in the same transaction. Then they are
sent through the outbox sender, as any dispatch (:mod:`sundial_dispatcher.sources`); a crash before that leaves
PENDING rows the sweeper sends.

A leader killed mid-backfill loses nothing and doubles nothing: the next one continues from the committed
cursor, and an occurrence committed by the dead one is found taken.

A suspended tenant's backfills are not stepped (their cursor waits for its resume, and the rate budget does not
pile up: it is capped at ``max_budget_sec``). The others' steps stay within fair dispatch's limits
(:mod:`sundial_dispatcher.limits`): a step takes at most the room its tenant and pool have, and what does not fit
waits behind the cursor for a later step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

from opentelemetry.trace import Link, Span, get_current_span
from sundial_common.broker.kafka import Publisher
from sundial_common.domain.ids import new_id
from sundial_common.domain.schedules import occurrences, spec_from_row
from sundial_common.observability.tracing import (
    context_from,
    trace_id_hex,
    traceparent,
)
from sundial_common.runtime.clock import Clock
from sundial_common.stores.backfills import (
    BackfillAdvance,
    BackfillExecution,
    BackfillOutcome,
    BackfillPlan,
    BackfillStore,
)
from sundial_common.stores.dispatch import DispatchStore
from sundial_common.stores.types import Record

from sundial_dispatcher.dispatch_spans import end_failed, end_rate_limited
from sundial_dispatcher.limits import Limits, Room
from sundial_dispatcher.sources import dispatch_once
from sundial_dispatcher.waiting_work import WaitingWorkConfig, WaitingWorkSource, first_attempt_span

_BEFORE = timedelta(microseconds=1)


@dataclass(frozen=True)
class BackfillConfig(WaitingWorkConfig):
    #: Seconds between steps of the shard's running backfills.
    interval_sec: float = 0.2
    #: Running backfills stepped per transaction.
    batch_backfills: int = 100
    #: Most executions one backfill creates per step, whatever its rate.
    max_per_step: int = 1000
    #: A step spends at most this many seconds of rate budget (no burst after an outage).
    max_budget_sec: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_budget_sec <= 0:
            raise ValueError("max_budget_sec must be > 0")
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
class BackfillStepPlanner:
    """Decides, inside the step's transaction, each backfill's next occurrences within its rate budget and ``room``,
    then takes their dispatch-rate tokens from ``limits``."""

    config: BackfillConfig
    room: Room
    limits: Limits
    spans: dict[UUID, Span] = field(default_factory=dict)
    running: int = 0

    async def __call__(self, running: Sequence[Record]) -> BackfillPlan:
        self.running = len(running)
        plan = self._decide(running)
        if not plan.executions:
            return plan
        kept = await self.limits.within_rate(self.room, [p.backfill["tenant_id"] for p in plan.executions])
        if all(kept):
            return plan
        # A tenant's last occurrences got no token: each backfill keeps its first ones and its cursor stops there.
        executions: list[BackfillExecution] = []
        dropped: set[UUID] = set()
        cursors: dict[UUID, datetime | None] = {}
        for p, keep in zip(plan.executions, kept, strict=True):
            if keep:
                executions.append(p)
                cursors[p.backfill["id"]] = p.scheduled_for
            else:
                dropped.add(p.execution_id)
                cursors.setdefault(p.backfill["id"], None)
        end_rate_limited(self.spans, dropped)
        plan.executions = executions
        advances = []
        for advance in plan.advances:
            if advance.backfill_id not in cursors:
                advances.append(advance)
            elif (cursor := cursors[advance.backfill_id]) is not None:
                advances.append(BackfillAdvance(advance.backfill_id, cursor, 0, False))
            # else nothing of it kept: no step, stepped_at stays and its budget keeps growing
        plan.advances = advances
        return plan

    def _decide(self, running: Sequence[Record]) -> BackfillPlan:
        plan = BackfillPlan()
        for backfill in running:
            room = self.room.available(backfill["tenant_id"], backfill["pool"])
            budget = min(self._budget(backfill), room)
            if budget < 1:
                continue  # its budget is not spent (or no room): stepped_at stays, the budget keeps growing
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
            self.room.use(backfill["tenant_id"], backfill["pool"], len(batch))
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
        span = first_attempt_span(
            backfill,
            backfill["job_id"],
            execution_id,
            links,
            {"sundial.scheduled_for": nominal.isoformat(), "sundial.backfill_id": str(backfill["id"])},
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


@dataclass(frozen=True, slots=True)
class _Stepped:
    """What one backfill step committed, and the planner that decided it (its spans, the backfills it saw)."""

    outcome: BackfillOutcome
    planner: BackfillStepPlanner


class BackfillDispatcher(WaitingWorkSource):
    """Leader-only: one shard's running backfills stepped under one term's fencing token; a dispatch source
    (:mod:`sundial_dispatcher.sources`) whose claim is the room fair dispatch leaves it (the backfills' cursors
    are in Postgres: nothing to put back)."""

    what = "backfill"
    noun = "backfill"

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
        limits: Limits | None = None,
    ) -> None:
        super().__init__(shard, token, holder, outbox, publisher, config, clock, limits)
        self.store = store
        self.config = config

    async def run_if_due(self) -> BackfillResult | None:
        """:meth:`run_once` when its :attr:`cadence` says (the dispatch loop's hook)."""
        if not self.cadence.due():
            return None
        result = await self.run_once()
        self.cadence.looked(found=bool(result.running))
        return result

    async def run_once(self) -> BackfillResult:
        """One fenced step of every running backfill, then the publishes. Raises ``FencedOut``."""
        return await dispatch_once(self)

    def nothing(self) -> BackfillResult:
        return BackfillResult()

    async def has_work(self) -> bool:
        return await self.store.has_running(self.shard)

    async def commit(self, room: Room) -> _Stepped:
        planner = BackfillStepPlanner(self.config, room, self.limits)
        try:
            async with self.store.step(
                self.shard,
                self.token,
                self.holder,
                self.config.batch_backfills,
                skip_tenants=room.blocked_tenants(),
                skip_pools=room.blocked_pools(),
            ) as step:
                plan = await planner(step.running)
                created = await step.create(plan.executions)
                await step.advance(plan.advances, created)
            outcome = BackfillOutcome(created, plan)
        except BaseException:
            end_failed(planner.spans, "backfill")
            raise
        # Planned but not created: the occurrence already had an execution.
        self.committed(
            outcome.created,
            planner.spans,
            ((p.backfill["tenant_id"], p.backfill["pool"]) for p in outcome.created),
            room,
        )
        return _Stepped(outcome, planner)

    async def send(self, stepped: _Stepped) -> BackfillResult:
        created = stepped.outcome.created
        result = BackfillResult(created=len(created), running=stepped.planner.running)
        if not created:
            return result
        result.published, result.publish_failed = await self.publish(
            created, [(p.backfill, p.backfill["job_id"]) for p in created], stepped.planner.spans
        )
        return result
