"""Planning the due occurrences of a shard's jobs: which executions each locked job gets, and how it moves on.

The occurrence source's planner (:class:`OccurrencePlanner`), run by the dispatcher between the dispatch
transaction's lock and its write (:mod:`sundial_dispatcher.group_commit`): for a job whose schedule is due it
applies the catch-up and overlap policies (:func:`~sundial_dispatcher.planning.decide`) and recomputes the next
occurrence from the schedule; a pending manual trigger (``POST /v1/jobs/{id}/trigger``) becomes one more execution
that leaves the schedule where it is. Each PENDING execution gets its dispatch span (or, without an exporter, only
its traceparent); :func:`occurrence_message` is the message it is sent as.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol
from uuid import UUID

from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, get_current_span
from sundial_common.broker.messages import ExecutionMessage, pool_topic
from sundial_common.domain.ids import new_execution_id
from sundial_common.domain.schedules import fire_at, spec_from_row
from sundial_common.observability.tracing import (
    context_from,
    execution_attributes,
    execution_context,
    kafka_publish_attributes,
    spans_recorded,
    traceparent,
    tracer,
    unrecorded_traceparent,
)
from sundial_common.stores.dispatch import DispatchPlan, JobAdvance, PlannedExecution
from sundial_common.stores.types import Occurrence, Record

from sundial_dispatcher.planning import Catchup, Overlap, Policies, decide

__all__ = ["OccurrencePlanner", "PlanningConfig", "occurrence_message"]

#: Job types whose executions continue the trace of the request that created them. A recurring
#: job's fires each start a trace of their own, linked to the creating request.
_ONE_OFF = frozenset({"ONE_SHOT", "DELAYED"})


class PlanningConfig(Protocol):
    """What the planner reads of the dispatcher's configuration (``DispatcherConfig``)."""

    @property
    def fire_all_cap(self) -> int: ...

    @property
    def buffer_poll_sec(self) -> float: ...

    @property
    def suspended_poll_sec(self) -> float: ...


@functools.lru_cache(maxsize=256)
def _policies(overlap: str, catchup: str, catchup_window_sec: int, fire_all_cap: int) -> Policies:
    """A job's policies (frozen), built once per distinct combination (a handful in practice), not per execution:
    two enum lookups and a frozen dataclass were ~1.4 µs of each planned one."""
    return Policies(Overlap(overlap), Catchup(catchup), catchup_window_sec, fire_all_cap)


@dataclass
class OccurrencePlanner:
    """Decides, inside the dispatch transaction, each locked job's executions and its move.

    For a job whose schedule is due it applies the catch-up and overlap policies
    (:func:`~sundial_dispatcher.planning.decide`) and recomputes the next occurrence from the schedule; a
    pending manual trigger becomes one more execution that leaves the schedule where it is.
    """

    now: datetime
    config: PlanningConfig
    #: The dispatch span of each PENDING execution, while this process records spans (:func:`spans_recorded`);
    #: without an exporter none is made, only each execution's traceparent (:func:`unrecorded_traceparent`).
    spans: dict[UUID, Span] = field(default_factory=dict)
    #: Jobs to look at again soon (BUFFER_ONE waiting on an open execution).
    holds: list[Occurrence] = field(default_factory=list)
    #: Where each locked job's hot-window member belongs after this transaction (None: nowhere).
    members: dict[UUID, datetime | None] = field(default_factory=dict)
    #: Occurrences missed beyond their catch-up window, per tenant (sundial_missed_fires_total).
    missed: dict[str, int] = field(default_factory=dict)
    #: Tenants whose jobs wait (sundial_dispatcher.tenancy).
    suspended: frozenset[str] = frozenset()
    #: Whether this process records spans (an exporter is set up), asked once a pass rather than per execution.
    recorded: bool = field(default_factory=spans_recorded)

    def __call__(self, jobs: Sequence[Record]) -> DispatchPlan:
        executions: list[PlannedExecution] = []
        advances: list[JobAdvance] = []
        cancel: list[UUID] = []
        for job in jobs:
            if job["tenant_id"] in self.suspended:
                # Left as it is: once the tenant is resumed, what came due meets the catch-up policy.
                self.holds.append(Occurrence(job["id"], self.now + timedelta(seconds=self.config.suspended_poll_sec)))
                self.members[job["id"]] = None
                continue
            claimed = job["claimed_due"]
            schedule_due = (
                job["state"] == "ACTIVE" and job["next_fire_at"] is not None and job["next_fire_at"] <= claimed
            )
            trigger_due = job["trigger_at"] is not None and job["trigger_at"] <= claimed
            next_fire_at = job["next_fire_at"] if job["state"] == "ACTIVE" else None
            advance: JobAdvance | None = None
            nominals: set[datetime] = set()
            if schedule_due:
                advance, planned, to_cancel = self._schedule(job)
                executions += planned
                cancel += to_cancel
                nominals = {p.nominal for p in planned}
                if advance is not None:
                    next_fire_at = advance.next_fire_at
                else:  # held: its member comes back with the holds, not at its (past) fire time
                    next_fire_at = None
            if trigger_due:
                at = job["trigger_at"]
                while at in nominals:  # one occurrence, one execution: a trigger never lands on a scheduled one
                    at += timedelta(milliseconds=1)
                executions.append(self._execution(job, job["trigger_execution_id"], at, at, triggered=True))
                advance = (
                    JobAdvance(job["id"], job["next_fire_at"], None, None, advance=False, trigger_done=True)
                    if advance is None
                    else dataclasses.replace(advance, trigger_done=True)
                )
            if advance is not None:
                advances.append(advance)
            pending_trigger = job["trigger_at"] if not trigger_due else None
            candidates = [t for t in (next_fire_at, pending_trigger) if t is not None]
            self.members[job["id"]] = min(candidates) if candidates else None
        return DispatchPlan(executions, advances, cancel)

    def _schedule(self, job: Record) -> tuple[JobAdvance | None, list[PlannedExecution], list[UUID]]:
        """The due schedule of ``job``: its executions, its move (None: held, nothing changes), what to cancel."""
        spec = spec_from_row(job)
        nominal = job["next_nominal_at"] or job["next_fire_at"]
        decision = decide(
            spec,
            job["id"],
            nominal,
            self.now,
            runs_so_far=job["fire_count"],
            policies=_policies(
                job["overlap_policy"], job["catchup_policy"], job["catchup_window_sec"], self.config.fire_all_cap
            ),
            open_executions=job["open_execution_ids"] or (),
        )
        if decision.missed:
            self.missed[job["tenant_id"]] = self.missed.get(job["tenant_id"], 0) + decision.missed
        if decision.hold:
            retry_at = self.now + timedelta(seconds=self.config.buffer_poll_sec)
            self.holds.append(Occurrence(job["id"], retry_at))
            return None, [], []
        planned = [
            self._execution(job, new_execution_id(), n, fire_at(job["id"], n, spec.jitter_sec)) for n in decision.runs
        ]
        planned += [
            self._execution(
                job, new_execution_id(), n, fire_at(job["id"], n, spec.jitter_sec), state="SKIPPED", note=why
            )
            for n, why in decision.skipped
        ]
        following = decision.next_nominal
        advance = JobAdvance(
            job["id"],
            job["next_fire_at"],
            fire_at(job["id"], following, spec.jitter_sec) if following is not None else None,
            following,
            runs=len(decision.runs),
            missed=decision.missed,
        )
        return advance, planned, decision.cancel

    def _execution(
        self,
        job: Record,
        execution_id: UUID,
        nominal: datetime,
        due: datetime,
        *,
        state: str = "PENDING",
        triggered: bool = False,
        note: str | None = None,
    ) -> PlannedExecution:
        parent = None
        if state == "PENDING" and self.recorded:  # a SKIPPED occurrence is never published: no dispatch span
            span = self._span(job, execution_id, nominal, triggered)
            self.spans[execution_id] = span
            parent = traceparent(span)
        elif state == "PENDING":  # the same trace ids, without building what nobody records
            parent = unrecorded_traceparent(
                job["trigger_traceparent"] if triggered else job["traceparent"] if job["type"] in _ONE_OFF else None
            )
        return PlannedExecution(
            execution_id=execution_id,
            job=job,
            next_fire_at=None,
            traceparent=parent,
            scheduled_for=nominal,
            fire_at=due,
            state=state,
            triggered=triggered,
            note=note,
        )

    @staticmethod
    def _span(job: Record, execution_id: UUID, nominal: datetime, triggered: bool) -> Span:
        """The execution's first span, the anchor of its trace (its traceparent is stored on the row)."""
        attributes = {
            **execution_attributes(
                tenant=job["tenant_id"],
                job_id=job["id"],
                execution_id=execution_id,
                attempt=1,
                pool=job["pool"],
                handler=job["handler"],
            ),
            **kafka_publish_attributes(pool_topic(job["pool"]), str(execution_id)),
            "sundial.scheduled_for": nominal.isoformat(),
        }
        name = f"send {pool_topic(job['pool'])}"
        if triggered:
            # A trigger's execution continues the trace of the request that asked for it.
            attributes["sundial.triggered"] = True
            parent = execution_context(job["trigger_traceparent"])
            return tracer.start_span(name, context=parent, kind=SpanKind.PRODUCER, attributes=attributes)
        origin = context_from(job["traceparent"])
        if job["type"] in _ONE_OFF:
            # A one-off job has one execution: it continues the trace of the request that created the job.
            return tracer.start_span(
                name, context=execution_context(job["traceparent"]), kind=SpanKind.PRODUCER, attributes=attributes
            )
        # Each fire of a recurring job is a trace of its own, linked to the request that created the job.
        links = [Link(get_current_span(origin).get_span_context())] if origin else []
        return tracer.start_span(name, context=Context(), kind=SpanKind.PRODUCER, attributes=attributes, links=links)


def occurrence_message(p: PlannedExecution, fence_token: int, now: datetime | None) -> ExecutionMessage:
    """The message of a planned first attempt. ``now``: with a publish lead, an execution due after it carries its
    due instant (the worker holds it)."""
    job = p.job
    due = p.due
    return ExecutionMessage(
        execution_id=str(p.execution_id),
        job_id=str(job["id"]),
        tenant_id=job["tenant_id"],
        pool=job["pool"],
        handler=job["handler"],
        attempt=1,
        fence_token=fence_token,
        scheduled_for=p.nominal.isoformat(),
        timeout_sec=job["timeout_sec"],
        payload=job["payload"],
        traceparent=p.traceparent,
        due_at=due.isoformat() if now is not None and due > now else None,
    )
