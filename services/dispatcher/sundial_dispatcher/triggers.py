"""Dependent jobs' fires: the shard leader turns the triggers its parents' final states recorded into executions.

A parent execution reaching a final state records, in that same transaction, one ``job_triggers`` row per
child whose condition it meets (migration 0015). While it leads a shard, the leader runs
:meth:`TriggerDispatcher.run_once` beside its dispatch passes (at most every ``interval_sec``); each run is
the same steps as a dispatch (:mod:`sundial_dispatcher.sources`):

1. **Commit** one transaction
   (:meth:`~sundial_common.stores.dependencies.PostgresDependencyStore.trigger_transaction`): the store raises the
   shard fence to this term's token (a paused ex-leader is rejected) and locks the ACTIVE children with pending
   triggers; this module decides the fires (:class:`ChildFirePlanner`); the store inserts one execution per fire —
   unique per (child, trigger) in Postgres, so a repeated pass or a failed-over leader creates nothing twice — and
   marks the triggers consumed.
2. **Send** the new executions to their pools' topics through the outbox sender. A crash before that leaves
   PENDING rows the sweeper republishes (the execution row is the outbox).

What a fire is:

* **One parent**: one execution per parent execution that reached the state asked for.
* **Several parents (fan-in)**: one execution once *every* parent has at least one new qualifying execution
  since the child's last fire; it consumes every trigger waiting at that moment. A parent that ran twice
  before another ran once therefore counts once: the child runs once, ``causedBy`` lists all three.
* **Late triggers** (waiting longer than the child's ``catchupWindowSec``: the child was paused, its tenant
  suspended or at a quota, or no leader ran) follow its catch-up policy, as missed clock fires do:
  ``FIRE_ALL`` runs one per trigger, ``FIRE_ONCE`` (default) one for all late triggers, ``SKIP`` none
  (consumed as SKIPPED).

A suspended tenant's children are not looked at (their triggers wait, unconsumed, for its resume); the others'
fires are created within fair dispatch's limits (:mod:`sundial_dispatcher.limits`): a fire that does not fit
leaves its triggers waiting for a later pass.

Each child execution starts a trace of its own, linked to the trace of every parent execution it ran after.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

from opentelemetry.trace import Link, Span, get_current_span
from sundial_common.broker.kafka import Publisher
from sundial_common.domain.ids import new_id
from sundial_common.observability.tracing import (
    context_from,
    trace_id_hex,
    traceparent,
)
from sundial_common.runtime.clock import Clock
from sundial_common.stores.dependencies import DependencyStore, TriggeredExecution, TriggerOutcome, TriggerPlan
from sundial_common.stores.dispatch import DispatchStore
from sundial_common.stores.types import Record

from sundial_dispatcher.dispatch_spans import end_failed, end_rate_limited
from sundial_dispatcher.limits import Limits, Room
from sundial_dispatcher.sources import dispatch_once
from sundial_dispatcher.waiting_work import WaitingWorkConfig, WaitingWorkSource, first_attempt_span

_TICK = timedelta(microseconds=1)


@dataclass(frozen=True)
class TriggerConfig(WaitingWorkConfig):
    #: Seconds between looks at the shard's pending triggers (the child's start latency is about this).
    interval_sec: float = 0.1
    #: Children handled per transaction.
    batch_children: int = 500
    #: Triggers read per transaction.
    batch_triggers: int = 2000

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.batch_children <= 10000:
            raise ValueError("batch_children must be within 1..10000")
        if self.batch_triggers < self.batch_children:
            raise ValueError("batch_triggers must be >= batch_children")


@dataclass
class TriggerResult:
    #: Executions created from triggers.
    fired: int = 0
    #: Triggers consumed without a run (catch-up SKIP).
    skipped: int = 0
    published: int = 0
    publish_failed: int = 0


@dataclass
class ChildFirePlanner:
    """Decides, between the trigger transaction's lock and its write, each locked child's fires (see the module
    docstring) within ``room``, then takes their rate tokens from ``limits``."""

    room: Room
    limits: Limits
    spans: dict[UUID, Span] = field(default_factory=dict)

    async def plan(self, children: Sequence[Record], pending: Sequence[Record]) -> TriggerPlan:
        plan = self._decide(children, pending)
        if not plan.executions:
            return plan
        kept = await self.limits.within_rate(self.room, [p.child["tenant_id"] for p in plan.executions])
        if all(kept):
            return plan
        # A tenant's last fires got no token: they are not made, their triggers wait (a suffix of each child's).
        dropped = {p.execution_id for p, keep in zip(plan.executions, kept, strict=True) if not keep}
        end_rate_limited(self.spans, dropped)
        plan.executions = [p for p in plan.executions if p.execution_id not in dropped]
        plan.consumed = [c for c in plan.consumed if c[2] not in dropped]
        return plan

    def _decide(self, children: Sequence[Record], pending: Sequence[Record]) -> TriggerPlan:
        plan = TriggerPlan()
        waiting: dict[UUID, list[Record]] = defaultdict(list)
        for trigger in pending:
            waiting[trigger["child_job_id"]].append(trigger)
        for child in children:
            triggers = waiting.get(child["id"], [])
            if not triggers:
                continue
            now: datetime = child["db_now"]
            last: datetime | None = child["last_scheduled_for"]
            at = now if last is None or last < now else last + _TICK
            late_before = now - timedelta(seconds=child["catchup_window_sec"])
            parents = set(child["parents"] or ())
            for group, skip in self._fires(child, triggers, parents, late_before):
                if skip:
                    plan.consumed += [(t["id"], "SKIPPED", None) for t in group]
                    continue
                if not self.room.available(child["tenant_id"], child["pool"]):
                    break  # no room: this fire and the child's later ones wait for a later pass
                self.room.use(child["tenant_id"], child["pool"], 1)
                execution = self._execution(child, group, at)
                at += _TICK
                plan.executions.append(execution)
                plan.consumed += [(t["id"], "FIRED", execution.execution_id) for t in group]
        return plan

    @staticmethod
    def _fires(
        child: Record, triggers: list[Record], parents: set[UUID], late_before: datetime
    ) -> list[tuple[list[Record], bool]]:
        """The child's fires: (the triggers each consumes, whether it is skipped instead of run)."""
        policy = child["catchup_policy"]
        if len(parents) > 1:
            if not parents <= {t["parent_job_id"] for t in triggers}:
                return []  # fan-in: some parent has no new qualifying execution yet
            late = max(t["created_at"] for t in triggers) < late_before
            return [(triggers, late and policy == "SKIP")]
        late = [t for t in triggers if t["created_at"] < late_before]
        fresh = [t for t in triggers if t["created_at"] >= late_before]
        fires: list[tuple[list[Record], bool]] = []
        if late:
            if policy == "FIRE_ALL":
                fires += [([t], False) for t in late]
            else:
                fires.append((late, policy == "SKIP"))
        return fires + [([t], False) for t in fresh]

    def _execution(self, child: Record, group: list[Record], at: datetime) -> TriggeredExecution:
        execution_id = new_id()
        span = self._span(child, execution_id, group)
        self.spans[execution_id] = span
        policy = child["retry_policy"] or {}
        return TriggeredExecution(
            execution_id=execution_id,
            child=child,
            scheduled_for=at,
            trigger_id=group[0]["id"],
            caused_by=tuple(t["parent_execution_id"] for t in group),
            max_attempts=int(policy.get("maxAttempts", 1)),
            trace_id=trace_id_hex(span),
            traceparent=traceparent(span),
        )

    @staticmethod
    def _span(child: Record, execution_id: UUID, group: list[Record]) -> Span:
        """The child execution's first span: a trace of its own, linked to each parent execution's trace."""
        links = []
        for trigger in group:
            parent = context_from(trigger["parent_traceparent"])
            if parent is not None:
                links.append(Link(get_current_span(parent).get_span_context(), {"sundial.link": "caused_by"}))
        return first_attempt_span(
            child,
            child["id"],
            execution_id,
            links,
            {"sundial.caused_by": [str(t["parent_execution_id"]) for t in group]},
        )


@dataclass(frozen=True, slots=True)
class _Fired:
    """What one trigger transaction committed, and the planner that decided it (its spans)."""

    outcome: TriggerOutcome
    planner: ChildFirePlanner


class TriggerDispatcher(WaitingWorkSource):
    """Leader-only: one shard's pending triggers become executions under one term's fencing token; a dispatch
    source (:mod:`sundial_dispatcher.sources`) whose claim is the room fair dispatch leaves it (the triggers wait
    in Postgres: nothing to put back)."""

    what = "trigger"
    noun = "child"

    def __init__(
        self,
        shard: int,
        token: int,
        holder: str,
        store: DependencyStore,
        outbox: DispatchStore,
        publisher: Publisher,
        config: TriggerConfig,
        clock: Clock | None = None,
        limits: Limits | None = None,
    ) -> None:
        super().__init__(shard, token, holder, outbox, publisher, config, clock, limits)
        self.store = store
        self.config = config

    async def run_if_due(self) -> TriggerResult | None:
        """:meth:`run_once` when its :attr:`cadence` says (the dispatch loop's hook)."""
        if not self.cadence.due():
            return None
        result = await self.run_once()
        done = result.fired + result.skipped
        self.cadence.looked(found=bool(done), more=done >= self.config.batch_children)
        return result

    async def run_once(self) -> TriggerResult:
        """One transaction of fires, then their publishes. Raises ``FencedOut`` if a newer leader has written."""
        return await dispatch_once(self)

    def nothing(self) -> TriggerResult:
        return TriggerResult()

    async def has_work(self) -> bool:
        return await self.store.has_pending(self.shard)

    async def commit(self, room: Room) -> _Fired:
        planner = ChildFirePlanner(room, self.limits)
        try:
            async with self.store.trigger_transaction(self.shard, self.token, self.holder) as tx:
                locked = await tx.lock(
                    self.config.batch_children,
                    self.config.batch_triggers,
                    skip_tenants=room.blocked_tenants(),
                    skip_pools=room.blocked_pools(),
                )
                plan = await planner.plan(locked.children, locked.pending) if locked.children else TriggerPlan()
                outcome = await tx.write(plan)
        except BaseException:
            end_failed(planner.spans, "trigger")
            raise
        # Planned but not created: the trigger already had its execution.
        self.committed(
            outcome.created, planner.spans, ((p.child["tenant_id"], p.child["pool"]) for p in outcome.created), room
        )
        return _Fired(outcome, planner)

    async def send(self, fired: _Fired) -> TriggerResult:
        created = fired.outcome.created
        result = TriggerResult(
            fired=len(created), skipped=sum(1 for c in fired.outcome.plan.consumed if c[1] == "SKIPPED")
        )
        if not created:
            return result
        result.published, result.publish_failed = await self.publish(
            created, [(p.child, p.child["id"]) for p in created], fired.planner.spans
        )
        return result
