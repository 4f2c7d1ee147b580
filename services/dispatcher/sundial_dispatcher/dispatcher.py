"""One shard's dispatch pass: claim due members, commit their executions (fenced), publish them.

The order is what makes dispatch safe (DESIGN invariants 1, 2 and 4):

1. **Claim** due members from the shard's hot window with one atomic Lua call. If the pass fails
   after this (Postgres down, fenced out), it puts them back at once; if the process dies, the members
   are gone from Redis but the jobs are untouched in Postgres, and the hydrator's overdue scan puts them
   back.
2. **Commit** one Postgres transaction: raise the shard fence to our token (or learn we are fenced
   out and stop), lock the jobs that still match, insert one execution per occurrence (unique, so a
   repeated claim creates nothing), advance each job's next fire with compare-and-set. The passes of the
   shards one process leads share their transactions when they coincide
   (:mod:`sundial_dispatcher.group_commit`); the fence is still raised, and checked, per shard.
3. **Publish** the created executions to their pools' topics, then mark them published. If the
   process dies before publishing, the execution rows are the outbox: the sweeper republishes
   PENDING executions that were never published.

Leader-only: a :class:`ShardDispatcher` exists only while its process holds the shard's term.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, get_current_span
from sundial_common.broker.kafka import Publisher
from sundial_common.broker.messages import ExecutionMessage, pool_topic
from sundial_common.domain.ids import new_execution_id
from sundial_common.domain.schedules import fire_at, spec_from_row
from sundial_common.hotwindow.window import Claimed, HotWindow
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
from sundial_common.runtime.clock import Clock, SystemClock
from sundial_common.runtime.crashpoints import crash_point
from sundial_common.stores.dispatch import DispatchOutcome, DispatchPlan, DispatchStore, JobAdvance, PlannedExecution
from sundial_common.stores.types import Occurrence, Record

from sundial_dispatcher.fairness import FairDispatch, FairnessConfig
from sundial_dispatcher.group_commit import GroupCommit, OccurrenceCommit
from sundial_dispatcher.metrics import count_dispatched, count_missed
from sundial_dispatcher.planning import Catchup, Overlap, Policies, decide
from sundial_dispatcher.retries import RetryDispatcher
from sundial_dispatcher.tenancy import TenantPolicy

log = logging.getLogger(__name__)

#: Job types whose executions continue the trace of the request that created them. A recurring
#: job's fires each start a trace of their own, linked to the creating request.
_ONE_OFF = frozenset({"ONE_SHOT", "DELAYED"})
#: Redis key a worker watches to stop a running execution (set for CANCEL_RUNNING; Postgres has the truth
#: in ``executions.cancel_requested_at``).
CANCEL_KEY = "sundial:cancel:{execution_id}"
CANCEL_KEY_TTL_SEC = 7 * 24 * 3600
# Members re-added just beyond the hot window cost nothing; one the hydrator's watermark has already passed
# would wait for the overdue scan (the API uses the same margin).
_HOT_WINDOW_MARGIN = timedelta(seconds=60)


@dataclass(frozen=True)
class DispatcherConfig:
    shards: int = 1
    #: Members claimed (and executions committed) per pass.
    batch_size: int = 1000
    #: Seconds between passes while due work waits for room (or without wake-ups: while nothing is due).
    poll_interval_sec: float = 0.05
    #: A shard that claimed more than this many members over the last second is dispatched every poll interval
    #: (in batches) rather than at each member's instant: a pass per instant in W3 at 2,500/s (312/s a shard) cost
    #: 0.32 ms of dispatcher CPU per execution against 0.19 with 50 ms polls. A sparse stream (W2: 42/s a shard)
    #: and the first member after a quiet spell still go at their instant.
    dense_per_sec: float = 100.0
    #: A dense shard's passes are spaced to take about this many members each (at the rate it claimed over the
    #: last second), ``poll_interval_sec`` to ``dense_max_interval_sec`` (if longer) apart: most of a pass's cost
    #: is per pass (its round trips to Redis, Postgres and the broker), not per execution, so a moderate stream
    #: (W3 1,500/s: 190/s a shard, ~9 a pass at 50 ms) is batched more, and a fast one (625/s a shard: 31 a
    #: pass at 50 ms) is not held back.
    dense_batch: int = 32
    dense_max_interval_sec: float = 0.1
    #: Next fires due within this horizon are put straight back into the hot window.
    hot_window_sec: int = 3600
    #: BUFFER_ONE: how often a job waiting for its open execution to end is looked at again.
    buffer_poll_sec: float = 1.0
    #: Catch-up FIRE_ALL: at most this many missed occurrences of one job run per pass.
    fire_all_cap: int = 100
    #: Seconds after a publish that its executions still PENDING are marked published (0: at once).
    mark_published_after_sec: float = 1.0
    #: The marks of a shard are written together, once the oldest has waited this much longer (at most
    #: ``mark_published_after_sec``): one statement every half second rather than one per pass. Marked per pass,
    #: W3 at 1,500/s wrote 1,095 marks of ~3 rows in 30 s (6.1 s of Postgres time: the statement is planned
    #: over every partition of ``executions`` each call).
    mark_published_every_sec: float = 0.5
    #: How often a due job of a suspended tenant is looked at again.
    suspended_poll_sec: float = 5.0
    #: A sparse shard's executions are committed and published up to this long before they are due, their message
    #: carrying the due instant; the worker holds each until then (sundial_worker.holding). The dispatch pass, the
    #: produce and the fetch then happen before the due instant, and a start is late only by the worker's timer and
    #: its start CAS. Not a dense shard's (``dense_per_sec``): its workers would release what a pass sent together one
    #: due instant at a time, a start CAS each (W3 2,500/s: 7,118 CAS calls instead of 961, +0.13 ms of CPU per
    #: execution); nor a burst claimed ahead (the fair buffer sends it at its instant, under the pools' queue caps).
    #: 0: published at the due instant. At most 1 s (the sweeper republishes what is unpublished after 5 s).
    publish_lead_sec: float = 0.0
    #: Weighted fair dispatch across tenants and short pool queues (sundial_dispatcher.fairness).
    fairness: FairnessConfig = field(default_factory=FairnessConfig)

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ValueError("shards must be >= 1")
        if not 1 <= self.batch_size <= 10000:
            raise ValueError("batch_size must be within 1..10000")
        if self.poll_interval_sec <= 0:
            raise ValueError("poll_interval_sec must be > 0")
        if self.dense_batch < 1:
            raise ValueError("dense_batch must be >= 1")
        if self.mark_published_after_sec < 0 or self.mark_published_every_sec < 0:
            raise ValueError("mark_published_after_sec and mark_published_every_sec must be >= 0")
        if not 0 <= self.publish_lead_sec <= 1:
            raise ValueError("publish_lead_sec must be within 0..1")


@dataclass
class DispatchResult:
    claimed: int = 0
    dispatched: int = 0
    published: int = 0
    publish_failed: int = 0
    #: Occurrences recorded as SKIPPED by an overlap policy.
    skipped: int = 0
    #: Jobs waiting for their open execution to end (BUFFER_ONE).
    held: int = 0
    #: Occurrences missed beyond their catch-up window.
    missed: int = 0
    #: Scheduled retries moved to their next attempt.
    retried: int = 0
    #: The pass took only a burst's head (``FairnessConfig.burst_head``): the next one follows at once.
    again: bool = False


@functools.lru_cache(maxsize=256)
def _policies(overlap: str, catchup: str, catchup_window_sec: int, fire_all_cap: int) -> Policies:
    """A job's policies (frozen), built once per distinct combination (a handful in practice), not per execution:
    two enum lookups and a frozen dataclass were ~1.4 µs of each planned one."""
    return Policies(Overlap(overlap), Catchup(catchup), catchup_window_sec, fire_all_cap)


@dataclass
class _Planner:
    """Decides, inside the dispatch transaction, each locked job's executions and its move.

    For a job whose schedule is due it applies the catch-up and overlap policies
    (:func:`~sundial_dispatcher.planning.decide`) and recomputes the next occurrence from the schedule; a
    pending manual trigger becomes one more execution that leaves the schedule where it is.
    """

    now: datetime
    config: DispatcherConfig
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


class ShardDispatcher:
    """Leader-only work for one shard under one term (``token`` is the term's fencing token)."""

    def __init__(
        self,
        shard: int,
        token: int,
        holder: str,
        store: DispatchStore,
        hot_window: HotWindow,
        publisher: Publisher,
        config: DispatcherConfig,
        clock: Clock | None = None,
        tenants: TenantPolicy | None = None,
        fair: FairDispatch | None = None,
        commit: GroupCommit | None = None,
    ) -> None:
        self.shard = shard
        self.token = token
        self.holder = holder
        self.store = store
        self.hot_window = hot_window
        self.publisher = publisher
        self.config = config
        self.clock = clock or SystemClock()
        self.tenants = tenants
        #: None: a pass takes the earliest due members, whoever they belong to.
        self.fair = fair
        #: Where a pass commits its claims: with the other shards' passes of this process (a GroupCommit), or
        #: (None) in a transaction of its own, through the store.
        self.commit = commit
        #: Published executions not yet marked in Postgres: (monotonic time of the publish, ids).
        self._unmarked: deque[tuple[float, list[UUID]]] = deque()
        #: When the earliest member left in the window after the last claim is due (None: empty).
        self._window_next: datetime | None = None
        #: How long before their due instant this shard's passes take members: ``publish_lead_sec`` while the shard
        #: is sparse, 0 while it is dense (the pass loop says: :meth:`sparse`).
        self.lead = timedelta(seconds=config.publish_lead_sec)

    def sparse(self, sparse: bool) -> None:
        """Whether the shard's stream is sparse (below ``dense_per_sec``): only then are members taken ahead."""
        self.lead = timedelta(seconds=self.config.publish_lead_sec if sparse else 0.0)

    def due_by(self) -> datetime:
        """What a pass dispatches is due by this instant: now plus the publish lead (:attr:`lead`)."""
        return self.clock.now() + self.lead

    async def run_once(self) -> DispatchResult:
        """One pass. Raises ``FencedOut`` if a newer leader has written for this shard."""
        await self._mark_published()
        with self.commit.claiming() if self.commit is not None else contextlib.nullcontext():
            if self.fair is not None:
                claimed = await self.fair.claim(self.clock.now(), self.lead)
            else:
                claimed = await self.hot_window.claim_due(self.shard, self.due_by(), self.config.batch_size)
                self._window_next = claimed.next_due
        if not claimed:
            return DispatchResult()
        try:
            result = await self._dispatch_claimed(claimed)
        except BaseException:
            await self._put_back(claimed)
            raise
        result.again = self.fair is not None and self.fair.cut_short
        return result

    def next_look(self) -> datetime | None:
        """The earliest instant the next pass may have work (None: nothing known): the window's earliest member
        after the last claim, or what the fair buffer holds; one poll interval from now while due work waits in
        the buffer for room (a pass at once would find none); or when the published marks waiting are due. A
        member is looked at :attr:`lead` before it is due."""
        now = self.clock.now()
        marks = self._marks_due(now)
        if self.fair is None:
            work = None if self._window_next is None else self._window_next - self.lead
        elif self.fair.waiting():
            work = now + timedelta(seconds=self.config.poll_interval_sec)
        else:
            work = self.fair.next_look(now, self.lead)
        return marks if work is None else work if marks is None else min(work, marks)

    def _marks_due(self, now: datetime) -> datetime | None:
        """When :meth:`_mark_published` will write the marks waiting (None: none wait).

        Marks are written by a pass, and an idle leader sleeps up to
        :data:`~sundial_common.hotwindow.window.WAKE_HORIZON_SEC` between passes: without this bound its last publishes'
        marks could land after the sweeper's ``unpublished_after_sec`` and have it publish them again.
        """
        if not self._unmarked:
            return None
        grouped = min(self.config.mark_published_every_sec, self.config.mark_published_after_sec)
        due_in = self._unmarked[0][0] + self.config.mark_published_after_sec + grouped - time.monotonic()
        return now + timedelta(seconds=max(due_in, 0.0))

    async def _put_back(self, claimed: Claimed) -> None:
        """A pass that failed after its claim (Postgres down, fenced out, cancelled) returns what it claimed.

        Its members go back at the scores they were claimed at, so the next pass of this leader or of the
        next one claims them again at once, instead of waiting for the hydrator's overdue scan. ``NX``: a
        member written since the claim (the API, a requeue after a commit) is newer. Putting back a member
        whose occurrence did commit (the failure came after it) costs one claim that matches nothing.
        Best effort: when Redis itself is down, the overdue scan still recovers them.
        """
        try:
            await asyncio.shield(self._add_back(claimed))
        except Exception as exc:
            log.warning("shard %d: could not put back %d claimed members: %r", self.shard, len(claimed), exc)

    async def _add_back(self, claimed: Claimed) -> None:
        await self.hot_window.add(self.shard, claimed.jobs, only_new=True)
        await self.hot_window.add_retries(self.shard, claimed.retries, only_new=True)
        log.info("shard %d: failed pass put back %d claimed members", self.shard, len(claimed))

    async def _dispatch_claimed(self, claimed: Claimed) -> DispatchResult:
        crash_point("dispatcher.after_claim")
        # Scheduled retries claimed with the jobs (see sundial_dispatcher.retries).
        retried = (await self._retries().dispatch(claimed.retries)).retried if claimed.retries else 0
        claims = claimed.jobs
        if not claims:
            return DispatchResult(claimed=len(claimed), retried=retried)
        suspended = await self.tenants.suspended() if self.tenants is not None else frozenset[str]()
        planner = _Planner(now=self.due_by(), config=self.config, suspended=suspended)
        try:
            commit: OccurrenceCommit = self.commit if self.commit is not None else self.store
            outcome = await commit.dispatch_occurrences(self.shard, self.token, self.holder, claims, planner)
        except BaseException:
            for span in planner.spans.values():
                span.set_status(Status(StatusCode.ERROR, "dispatch transaction failed"))
                span.end()
            raise
        crash_point("dispatcher.after_commit")
        planned = [p for p in outcome.created if p.state == "PENDING"]
        result = DispatchResult(
            claimed=len(claimed),
            retried=retried,
            dispatched=len(planned),
            skipped=len(outcome.created) - len(planned),
            held=len(planner.holds),
            missed=sum(a.missed for a in outcome.plan.advances),
        )
        count_dispatched((p.job["tenant_id"], p.job["pool"]) for p in planned)
        count_missed(planner.missed)
        created = {p.execution_id for p in planned}
        for execution_id, span in planner.spans.items():
            if execution_id not in created:  # the occurrence already had its execution
                span.set_attribute("sundial.duplicate", True)
                span.end()
        await self._requeue_next_fires(planner, outcome)
        await self._flag_cancellations(outcome.cancel_requested)
        if not planned:
            return result
        ahead = self.clock.now() if self.config.publish_lead_sec else None  # a burst's may be sent ahead too
        errors = await self.publisher.publish([self._message(p, ahead) for p in planned])
        published: list[UUID] = []
        for p, error in zip(planned, errors, strict=True):
            if error is None:
                published.append(p.execution_id)
            if (sent := planner.spans.get(p.execution_id)) is not None:  # a span only while spans are recorded
                if error is not None:
                    sent.set_status(Status(StatusCode.ERROR, f"publish failed: {error}"))
                sent.end()
        result.published = len(published)
        result.publish_failed = len(planned) - len(published)
        if result.publish_failed:
            # Not lost: the executions stay PENDING and unpublished, and the sweeper sends them again.
            log.warning(
                "shard %d: %d publishes failed (%s); the sweeper will retry them",
                self.shard,
                result.publish_failed,
                next(e for e in errors if e),
            )
        if published:
            self._unmarked.append((time.monotonic(), published))
        await self._mark_published()
        return result

    async def _mark_published(self) -> None:
        """Record ``published_at`` for executions published ``mark_published_after_sec`` ago and still PENDING.

        ``published_at`` tells the sweeper a PENDING execution is waiting in Kafka rather than never sent.
        Marking a second later, and only rows still PENDING, skips the write for nearly every execution: a
        worker has started it by then, and its start records the message's broker timestamp as
        ``published_at``. Marks still waiting when leadership ends are dropped; the sweeper then sends those
        executions again if they are still unstarted, and the start CAS drops the duplicate. The marks due are
        written in one statement once the oldest has waited ``mark_published_every_sec`` more.
        """
        now = time.monotonic()
        horizon = now - self.config.mark_published_after_sec
        grouped = min(self.config.mark_published_every_sec, self.config.mark_published_after_sec)
        if not self._unmarked or self._unmarked[0][0] > horizon - grouped:
            return
        due: list[UUID] = []
        while self._unmarked and self._unmarked[0][0] <= horizon:
            due += self._unmarked.popleft()[1]
        await self.store.mark_published(due)

    def _retries(self) -> RetryDispatcher:
        return RetryDispatcher(
            self.shard,
            self.token,
            self.holder,
            self.store,
            self.hot_window,
            self.publisher,
            self.clock,
            self.config.hot_window_sec,
            ahead=self.config.publish_lead_sec > 0,
        )

    async def _requeue_next_fires(self, planner: _Planner, outcome: DispatchOutcome) -> None:
        """Put the dispatched jobs' members back where they now belong, if that is inside the hot window.

        The claim removed each member; a job's next fire (or a trigger still pending) due soon goes straight
        back, as does a BUFFER_ONE job waiting on its open execution and a claimed member that raced ahead of
        a re-schedule. Further-out fires are the hydrator's to promote when their time comes. ``NX``: a member
        someone else (the API after a PATCH or resume) has written since the claim is newer than ours.
        """
        horizon = self.clock.now() + timedelta(seconds=self.config.hot_window_sec) + _HOT_WINDOW_MARGIN
        upcoming = [Occurrence(job_id, due) for job_id, due in planner.members.items() if due is not None]
        upcoming += planner.holds + outcome.misplaced
        await self.hot_window.add(self.shard, [o for o in upcoming if o.due < horizon], only_new=True)

    async def _flag_cancellations(self, execution_ids: Sequence[UUID]) -> None:
        """CANCEL_RUNNING: tell the workers running these to stop (Postgres already records the request)."""
        if not execution_ids:
            return
        async with self.hot_window.redis.pipeline(transaction=False) as pipe:
            for execution_id in execution_ids:
                pipe.set(CANCEL_KEY.format(execution_id=execution_id), "1", ex=CANCEL_KEY_TTL_SEC)
            await pipe.execute()

    def _message(self, p: PlannedExecution, now: datetime | None) -> ExecutionMessage:
        """``now``: with a publish lead, an execution due after it carries its due instant (the worker holds it)."""
        job = p.job
        due = p.due
        return ExecutionMessage(
            execution_id=str(p.execution_id),
            job_id=str(job["id"]),
            tenant_id=job["tenant_id"],
            pool=job["pool"],
            handler=job["handler"],
            attempt=1,
            fence_token=self.token,
            scheduled_for=p.nominal.isoformat(),
            timeout_sec=job["timeout_sec"],
            payload=job["payload"],
            traceparent=p.traceparent,
            due_at=due.isoformat() if now is not None and due > now else None,
        )
