"""One shard's dispatch pass: claim due members, commit their executions (fenced), publish them.

The order is what makes dispatch safe (DESIGN invariants 1, 2 and 4):

1. **Claim** due members from the shard's hot window with one atomic Lua call. If the process dies
   after this, the members are gone from Redis but the jobs are untouched in Postgres; the
   hydrator's overdue scan puts them back.
2. **Commit** one Postgres transaction: raise the shard fence to our token (or learn we are fenced
   out and stop), lock the jobs that still match, insert one execution per occurrence (unique, so a
   repeated claim creates nothing), advance each job's next fire with compare-and-set.
3. **Publish** the created executions to their pools' topics, then mark them published. If the
   process dies before publishing, the execution rows are the outbox: the sweeper republishes
   PENDING executions that were never published.

Leader-only: a :class:`ShardDispatcher` exists only while its process holds the shard's term.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, get_current_span
from sundial_common.broker import Publisher
from sundial_common.clock import Clock, SystemClock
from sundial_common.crashpoints import crash_point
from sundial_common.hotwindow import HotWindow
from sundial_common.ids import new_id
from sundial_common.messages import ExecutionMessage
from sundial_common.store import Occurrence, PlannedExecution, Record, Store
from sundial_common.telemetry import context_from, trace_id_hex, traceparent, tracer

log = logging.getLogger(__name__)

#: Job types whose executions continue the trace of the request that created them. A recurring
#: job's fires each start a trace of their own, linked to the creating request.
_ONE_OFF = frozenset({"ONE_SHOT", "DELAYED"})


@dataclass(frozen=True)
class DispatcherConfig:
    shards: int = 1
    #: Members claimed (and executions committed) per pass.
    batch_size: int = 1000
    #: Seconds between passes while nothing is due.
    poll_interval_sec: float = 0.05
    #: Next fires due within this horizon are put straight back into the hot window.
    hot_window_sec: int = 3600

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ValueError("shards must be >= 1")
        if not 1 <= self.batch_size <= 10000:
            raise ValueError("batch_size must be within 1..10000")
        if self.poll_interval_sec <= 0:
            raise ValueError("poll_interval_sec must be > 0")


@dataclass
class DispatchResult:
    claimed: int = 0
    dispatched: int = 0
    published: int = 0
    publish_failed: int = 0


@dataclass
class _Planner:
    """Decides, inside the dispatch transaction, each locked job's execution and next fire."""

    spans: dict[str, Span] = field(default_factory=dict)

    def __call__(self, jobs: Sequence[Record]) -> list[PlannedExecution]:
        planned = []
        for job in jobs:
            execution_id = new_id()
            span = self._span(job, str(execution_id))
            self.spans[str(execution_id)] = span
            policy = job["retry_policy"] or {}
            planned.append(
                PlannedExecution(
                    execution_id=execution_id,
                    job=job,
                    next_fire_at=None,  # one-off jobs fire once; recurring schedules come with their issue
                    max_attempts=int(policy.get("maxAttempts", 1)),
                    trace_id=trace_id_hex(span),
                    traceparent=traceparent(span),
                )
            )
        return planned

    @staticmethod
    def _span(job: Record, execution_id: str) -> Span:
        attributes = {
            "sundial.job_id": str(job["id"]),
            "sundial.execution_id": execution_id,
            "sundial.tenant": job["tenant_id"],
            "sundial.pool": job["pool"],
            "sundial.handler": job["handler"],
            "sundial.scheduled_for": job["next_fire_at"].isoformat(),
        }
        origin = context_from(job["traceparent"])
        if job["type"] in _ONE_OFF:
            return tracer.start_span("dispatch", context=origin, kind=SpanKind.PRODUCER, attributes=attributes)
        links = [Link(get_current_span(origin).get_span_context())] if origin else []
        return tracer.start_span("dispatch", context=None, kind=SpanKind.PRODUCER, attributes=attributes, links=links)


class ShardDispatcher:
    """Leader-only work for one shard under one term (``token`` is the term's fencing token)."""

    def __init__(
        self,
        shard: int,
        token: int,
        holder: str,
        store: Store,
        hot_window: HotWindow,
        publisher: Publisher,
        config: DispatcherConfig,
        clock: Clock | None = None,
    ) -> None:
        self.shard = shard
        self.token = token
        self.holder = holder
        self.store = store
        self.hot_window = hot_window
        self.publisher = publisher
        self.config = config
        self.clock = clock or SystemClock()

    async def run_once(self) -> DispatchResult:
        """One pass. Raises ``FencedOut`` if a newer leader has written for this shard."""
        claims = await self.hot_window.claim(self.shard, self.clock.now(), self.config.batch_size)
        if not claims:
            return DispatchResult()
        crash_point("dispatcher.after_claim")
        planner = _Planner()
        try:
            planned = await self.store.dispatch(self.shard, self.token, self.holder, claims, planner)
        except BaseException:
            for span in planner.spans.values():
                span.set_status(Status(StatusCode.ERROR, "dispatch transaction failed"))
                span.end()
            raise
        crash_point("dispatcher.after_commit")
        result = DispatchResult(claimed=len(claims), dispatched=len(planned))
        created = {str(p.execution_id) for p in planned}
        for execution_id, span in planner.spans.items():
            if execution_id not in created:  # the occurrence already had its execution
                span.set_attribute("sundial.duplicate", True)
                span.end()
        if not planned:
            return result
        await self._requeue_next_fires(planned)
        messages = [self._message(p) for p in planned]
        errors = await self.publisher.publish(messages)
        published: set[str] = set()
        for message, error in zip(messages, errors, strict=True):
            span = planner.spans[message.execution_id]
            if error is None:
                published.add(message.execution_id)
            else:
                span.set_status(Status(StatusCode.ERROR, f"publish failed: {error}"))
            span.end()
        result.published = len(published)
        result.publish_failed = len(messages) - len(published)
        if result.publish_failed:
            # Not lost: the executions stay PENDING and unpublished, and the sweeper sends them again.
            log.warning(
                "shard %d: %d publishes failed (%s); the sweeper will retry them",
                self.shard,
                result.publish_failed,
                next(e for e in errors if e),
            )
        await self.store.mark_published([p.execution_id for p in planned if str(p.execution_id) in published])
        return result

    async def _requeue_next_fires(self, planned: Sequence[PlannedExecution]) -> None:
        """Jobs whose next fire is already inside the hot window go straight back into it.

        Further-out fires are the hydrator's to promote when their time comes.
        """
        horizon = self.clock.now() + timedelta(seconds=self.config.hot_window_sec)
        upcoming = [
            Occurrence(p.job["id"], p.next_fire_at)
            for p in planned
            if p.next_fire_at is not None and p.next_fire_at < horizon
        ]
        await self.hot_window.add(self.shard, upcoming)

    def _message(self, p: PlannedExecution) -> ExecutionMessage:
        job = p.job
        return ExecutionMessage(
            execution_id=str(p.execution_id),
            job_id=str(job["id"]),
            tenant_id=job["tenant_id"],
            pool=job["pool"],
            handler=job["handler"],
            attempt=1,
            fence_token=self.token,
            scheduled_for=job["next_fire_at"].isoformat(),
            timeout_sec=job["timeout_sec"],
            payload=job["payload"],
            traceparent=p.traceparent,
        )
