"""One shard's dispatch pass: claim due members, commit their executions (fenced), send them.

The due occurrences of a shard's jobs are a dispatch source (:mod:`sundial_dispatcher.sources`); the order is
what makes dispatch safe (nothing accepted is lost, one occurrence gets one execution, a deposed leader writes
nothing):

1. **Claim** due members from the shard's hot window with one atomic Lua call. If the pass fails
   after this (Postgres down, fenced out), it puts them back at once; if the process dies, the members
   are gone from Redis but the jobs are untouched in Postgres, and the hydrator's overdue scan puts them
   back.
2. **Commit** one Postgres transaction: raise the shard fence to our token (or learn we are fenced
   out and stop), lock the jobs that still match, insert one execution per occurrence (unique, so a
   repeated claim creates nothing), advance each job's next fire with compare-and-set; what to create is
   decided between the lock and the write (:mod:`sundial_dispatcher.occurrences`). The passes of the shards
   one process leads share their transactions when they coincide (:mod:`sundial_dispatcher.group_commit`); the
   fence is still raised, and checked, per shard. Scheduled retries claimed with the jobs (and, under fair
   dispatch, taken by the same round robin: :mod:`sundial_dispatcher.fairness`) are a source of their own
   (:mod:`sundial_dispatcher.retries`), committed and sent after the pass's first fires are sent: a bulk
   re-drive's retry transaction and publish never make the other jobs of its shard late.
3. **Send** the created executions to their pools' topics through the outbox sender, then mark them
   published. If the process dies before sending, the execution rows are the outbox: the sweeper republishes
   PENDING executions that were never published.

Leader-only: a :class:`ShardDispatcher` exists only while its process holds the shard's term.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

from sundial_common.broker.kafka import Publisher
from sundial_common.broker.outbox import OutboxSender
from sundial_common.hotwindow.window import Claimed, HotWindow
from sundial_common.runtime.clock import Clock, SystemClock
from sundial_common.runtime.crashpoints import crash_point
from sundial_common.stores.dispatch import DispatchOutcome, DispatchStore
from sundial_common.stores.types import Occurrence, RetryDue

from sundial_dispatcher.dispatch_spans import end_duplicates, end_failed
from sundial_dispatcher.fairness import FairDispatch, FairnessConfig
from sundial_dispatcher.group_commit import GroupCommit, OccurrenceCommit, SoleCommit
from sundial_dispatcher.metrics import count_dispatched, count_missed
from sundial_dispatcher.occurrences import OccurrencePlanner, occurrence_message
from sundial_dispatcher.published_marks import PublishedMarks
from sundial_dispatcher.retries import RetryDispatcher
from sundial_dispatcher.sources import dispatch_once
from sundial_dispatcher.tenancy import TenantPolicy

log = logging.getLogger(__name__)

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
    #: (in batches) rather than at each member's instant: a pass per instant at a steady 2,500/s (312/s a shard) cost
    #: 0.32 ms of dispatcher CPU per execution against 0.19 with 50 ms polls. A sparse stream (333/s: 42/s a shard)
    #: and the first member after a quiet spell still go at their instant.
    dense_per_sec: float = 100.0
    #: A dense shard's passes are spaced to take about this many members each (at the rate it claimed over the
    #: last second), ``poll_interval_sec`` to ``dense_max_interval_sec`` (if longer) apart: most of a pass's cost
    #: is per pass (its round trips to Redis, Postgres and the broker), not per execution, so a moderate stream
    #: (1,500/s: 190/s a shard, ~9 a pass at 50 ms) is batched more, and a fast one (625/s a shard: 31 a
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
    #: The marks of a process's shards are written together, once the oldest has waited this much longer (at most
    #: ``mark_published_after_sec``): one statement every half second rather than one per pass and shard
    #: (:mod:`sundial_dispatcher.published_marks`).
    mark_published_every_sec: float = 0.5
    #: How often a due job of a suspended tenant is looked at again.
    suspended_poll_sec: float = 5.0
    #: A sparse shard's executions are committed and published up to this long before they are due, their message
    #: carrying the due instant; the worker holds each until then (sundial_worker.holding). The dispatch pass, the
    #: produce and the fetch then happen before the due instant, and a start is late only by the worker's timer and
    #: its start CAS. Not a dense shard's (``dense_per_sec``): its workers would release what a pass sent together one
    #: due instant at a time, a start CAS each (a steady 2,500/s: 7,118 CAS calls instead of 961, +0.13 ms of CPU per
    #: execution); nor a burst claimed ahead (the fair buffer sends it at its instant, under the pools' queue caps).
    #: 0: published at the due instant. At most 1 s (the sweeper republishes what is unpublished after 5 s).
    publish_lead_sec: float = 0.0
    #: A sparse shard's pass, which comes ``publish_lead_sec`` before the earliest member is due, also takes what
    #: comes due within this much after that member (only with a publish lead: its workers hold each message until
    #: its instant, so none starts sooner or later for it). At 333 due a second over 8 shards a pass per member took
    #: one execution each — a claim, a dispatch transaction, a produce request and a published mark per execution;
    #: 0.2 s makes it about eight, for no added lateness. The service's default is 0.5 s: a process's sparse shards
    #: pass together on its grid, so at 50 due a second a dispatch transaction and produce request carry ~9
    #: executions instead of ~4 (at 333/s, ~44 instead of ~24). Within 0..1 (a message is then sent at most
    #: ``publish_lead_sec`` + this ahead, well inside the sweeper's 5 s before it republishes the unpublished).
    gather_sec: float = 0.0
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
        if not 0 <= self.gather_sec <= 1:
            raise ValueError("gather_sec must be within 0..1")


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


@dataclass
class _Committed:
    """What a pass committed: its claim's size, the retries sent, the occurrences' outcome and planner, and the
    claimed retries still to commit and send once the occurrences are sent."""

    claimed: int
    retried: int
    outcome: DispatchOutcome | None = None
    planner: OccurrencePlanner | None = None
    retries: Sequence[RetryDue] = ()


class ShardDispatcher:
    """Leader-only work for one shard under one term (``token`` is the term's fencing token): the due occurrences
    of its jobs as a dispatch source (:mod:`sundial_dispatcher.sources`)."""

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
        marks: PublishedMarks | None = None,
    ) -> None:
        self.shard = shard
        self.token = token
        self.holder = holder
        self.store = store
        self.hot_window = hot_window
        #: Every message of this term leaves through these (first attempts, retries), stamped with its token.
        self.sender = OutboxSender(publisher, "dispatch", token)
        self.retry_sender = OutboxSender(publisher, "retry", token)
        self.config = config
        self.clock = clock or SystemClock()
        self.tenants = tenants
        #: None: a pass takes the earliest due members, whoever they belong to.
        self.fair = fair
        #: Where a pass commits its claims: with the other shards' passes of this process (a GroupCommit), or
        #: (None) in a transaction of its own (:class:`~sundial_dispatcher.group_commit.SoleCommit`).
        self.commit_with = commit
        #: Published executions not yet marked in Postgres: with the other shards' of this process, or (None) its own.
        self.marks = marks or PublishedMarks(store, config.mark_published_after_sec, config.mark_published_every_sec)
        #: When the earliest member left in the window after the last claim is due (None: empty).
        self._window_next: datetime | None = None
        #: How long before its due instant a pass looks at the earliest member: ``publish_lead_sec`` while the shard
        #: is sparse, 0 while it is dense (the pass loop says: :meth:`sparse`).
        self.look_lead = timedelta(seconds=config.publish_lead_sec)
        #: How far ahead of now a pass takes members: the look lead, and ``gather_sec`` more while sparse with a
        #: publish lead (what comes due soon after the earliest member goes with it).
        self.lead = self.look_lead + self._gather(True)

    def _gather(self, sparse: bool) -> timedelta:
        lead = self.config.publish_lead_sec
        return timedelta(seconds=self.config.gather_sec if sparse and lead > 0 else 0.0)

    def sparse(self, sparse: bool) -> None:
        """Whether the shard's stream is sparse (below ``dense_per_sec``): only then are members taken ahead."""
        self.look_lead = timedelta(seconds=self.config.publish_lead_sec if sparse else 0.0)
        self.lead = self.look_lead + self._gather(sparse)

    def due_by(self) -> datetime:
        """What a pass dispatches is due by this instant: now plus the publish lead (:attr:`lead`)."""
        return self.clock.now() + self.lead

    async def run_once(self) -> DispatchResult:
        """One pass. Raises ``FencedOut`` if a newer leader has written for this shard."""
        result = await dispatch_once(self)
        result.again = self.fair is not None and self.fair.cut_short
        return result

    def nothing(self) -> DispatchResult:
        return DispatchResult()

    async def claim(self) -> Claimed | None:
        """The shard's due members (jobs and scheduled retries), after writing the published marks now due."""
        await self.marks.write_due()
        with self.commit_with.claiming() if self.commit_with is not None else contextlib.nullcontext():
            if self.fair is not None:
                claimed = await self.fair.claim(self.clock.now(), self.lead)
            else:
                claimed = await self.hot_window.claim_due(self.shard, self.due_by(), self.config.batch_size)
                self._window_next = claimed.next_due
        return claimed if claimed else None

    def next_look(self) -> datetime | None:
        """The earliest instant the next pass may have work (None: nothing known): the window's earliest member
        after the last claim, or what the fair buffer holds; one poll interval from now while due work waits in
        the buffer for room (a pass at once would find none); or when the published marks waiting are due. A
        member is looked at :attr:`look_lead` before it is due."""
        now = self.clock.now()
        marks = self._marks_due(now)
        if self.fair is None:
            work = None if self._window_next is None else self._window_next - self.look_lead
        elif self.fair.waiting():
            work = now + timedelta(seconds=self.config.poll_interval_sec)
        else:
            work = self.fair.next_look(now, self.look_lead)
        return marks if work is None else work if marks is None else min(work, marks)

    def _marks_due(self, now: datetime) -> datetime | None:
        """When the published marks waiting will be written (None: none wait).

        Marks are written by a pass, and an idle leader sleeps up to
        :data:`~sundial_common.hotwindow.window.WAKE_HORIZON_SEC` between passes: without this bound its last publishes'
        marks could land after the sweeper's ``unpublished_after_sec`` and have it publish them again.
        """
        due_in = self.marks.due_in()
        return None if due_in is None else now + timedelta(seconds=due_in)

    async def put_back(self, claimed: Claimed) -> None:
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

    async def commit(self, claimed: Claimed) -> _Committed:
        """The claimed occurrences' fenced transaction; the claimed retries' pass comes after their send
        (:meth:`send`), or here when the pass claimed no occurrence."""
        crash_point("dispatcher.after_claim")
        if not claimed.jobs:
            # Scheduled retries alone (see sundial_dispatcher.retries): committed and sent now.
            return _Committed(len(claimed), (await self._retries(claimed.retries).dispatch()).retried)
        suspended = await self.tenants.suspended() if self.tenants is not None else frozenset[str]()
        planner = OccurrencePlanner(now=self.due_by(), config=self.config, suspended=suspended)
        committer: OccurrenceCommit = self.commit_with if self.commit_with is not None else SoleCommit(self.store)
        try:
            outcome = await committer.dispatch_occurrences(self.shard, self.token, self.holder, claimed.jobs, planner)
        except BaseException:
            end_failed(planner.spans, "dispatch")
            raise
        crash_point("dispatcher.after_commit")
        return _Committed(len(claimed), 0, outcome, planner, claimed.retries)

    async def send(self, committed: _Committed) -> DispatchResult:
        """Send the pass's first fires, then commit and send its retries (:meth:`_send_retries`)."""
        result = await self._send_occurrences(committed)
        if committed.retries:
            result.retried = await self._send_retries(committed.retries)
        return result

    async def _send_retries(self, retries: Sequence[RetryDue]) -> int:
        """The retries' own fenced pass, after the occurrences they were claimed with are committed and sent: a
        retry transaction and publish (a bulk re-drive's, say) no longer comes before the shard's first fires. If
        it fails (fenced out, Postgres down), only the retries go back; the occurrences are done."""
        try:
            return (await self._retries(retries).dispatch()).retried
        except BaseException:
            await self._put_back_retries(retries)
            raise

    async def _put_back_retries(self, retries: Sequence[RetryDue]) -> None:
        try:
            await asyncio.shield(self.hot_window.add_retries(self.shard, retries, only_new=True))
        except Exception as exc:
            log.warning("shard %d: could not put back %d claimed retries: %r", self.shard, len(retries), exc)

    async def _send_occurrences(self, committed: _Committed) -> DispatchResult:
        """Count, requeue the jobs' next fires, flag cancellations and send the created executions."""
        outcome, planner = committed.outcome, committed.planner
        if outcome is None or planner is None:
            return DispatchResult(claimed=committed.claimed, retried=committed.retried)
        planned = [p for p in outcome.created if p.state == "PENDING"]
        result = DispatchResult(
            claimed=committed.claimed,
            retried=committed.retried,
            dispatched=len(planned),
            skipped=len(outcome.created) - len(planned),
            held=len(planner.holds),
            missed=sum(a.missed for a in outcome.plan.advances),
        )
        count_dispatched((p.job["tenant_id"], p.job["pool"]) for p in planned)
        count_missed(planner.missed)
        # Planned but not created: the occurrence already had its execution.
        end_duplicates(planner.spans, {p.execution_id for p in planned})
        await self._requeue_next_fires(planner, outcome)
        await self._flag_cancellations(outcome.cancel_requested)
        if not planned:
            return result
        ahead = self.clock.now() if self.config.publish_lead_sec else None  # a burst's may be sent ahead too
        sent = await self.sender.send(
            [occurrence_message(p, self.sender.fence_token, ahead) for p in planned],
            [p.execution_id for p in planned],
            [planner.spans.get(p.execution_id) for p in planned] if planner.spans else (),
        )
        result.published = len(sent.sent)
        result.publish_failed = sent.failed
        if sent.failed:
            # Not lost: the executions stay PENDING and unpublished, and the sweeper sends them again.
            log.warning(
                "shard %d: %d publishes failed (%s); the sweeper will retry them",
                self.shard,
                sent.failed,
                sent.first_error,
            )
        self.marks.add(sent.sent)
        await self.marks.write_due()
        return result

    def _retries(self, claims: Sequence[RetryDue]) -> RetryDispatcher:
        return RetryDispatcher(
            self.shard,
            self.holder,
            self.store,
            self.hot_window,
            self.retry_sender,
            self.clock,
            self.config.hot_window_sec,
            claims,
            ahead=self.config.publish_lead_sec > 0,
        )

    async def _requeue_next_fires(self, planner: OccurrencePlanner, outcome: DispatchOutcome) -> None:
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
