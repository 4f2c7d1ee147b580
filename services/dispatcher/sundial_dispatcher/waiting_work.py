"""What the dispatch sources whose work waits in Postgres share: dependent jobs' fires and backfills.

:class:`~sundial_dispatcher.triggers.TriggerDispatcher` and :class:`~sundial_dispatcher.backfills.BackfillDispatcher`
each turn rows that wait in Postgres (pending triggers, running backfills) into first attempts, under one term's
fencing token. Nothing is taken out of the hot window, so their claim is only the room fair dispatch leaves them and
there is nothing to put back; a committed execution gets a trace of its own (linked to what caused it) and leaves
through the outbox sender. :class:`WaitingWorkSource` holds those common steps; each source keeps its planner and
its transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind
from sundial_common.broker.kafka import Publisher
from sundial_common.broker.messages import ExecutionMessage, pool_topic
from sundial_common.broker.outbox import OutboxSender
from sundial_common.observability.tracing import execution_attributes, kafka_publish_attributes, tracer
from sundial_common.runtime.clock import Clock, SystemClock
from sundial_common.runtime.crashpoints import crash_point
from sundial_common.stores.dispatch import DispatchStore
from sundial_common.stores.types import Record

from sundial_dispatcher.dispatch_spans import end_duplicates
from sundial_dispatcher.limits import Limits, NoLimits, Room
from sundial_dispatcher.metrics import count_dispatched
from sundial_dispatcher.side_work import Cadence

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WaitingWorkConfig:
    """How often a source looks at its shard's waiting work. Validated at construction."""

    #: Seconds between looks at the shard's waiting work.
    interval_sec: float
    #: While looks find nothing, the interval doubles up to this: an idle leader's cost, and how long new work
    #: waits for its first look after a quiet spell.
    idle_interval_sec: float = 1.0

    def __post_init__(self) -> None:
        if self.interval_sec <= 0:
            raise ValueError("interval_sec must be > 0")


class FirstAttempt(Protocol):
    """A planned execution of a source: its first attempt."""

    @property
    def execution_id(self) -> UUID: ...
    @property
    def scheduled_for(self) -> datetime: ...
    @property
    def traceparent(self) -> str | None: ...


def first_attempt_span(
    job: Record, job_id: UUID, execution_id: UUID, links: Sequence[Link], extra: Mapping[str, Any]
) -> Span:
    """The first span of a new execution of ``job``: a trace of its own (``links`` to what caused it)."""
    topic = pool_topic(job["pool"])
    return tracer.start_span(
        f"send {topic}",
        context=Context(),
        kind=SpanKind.PRODUCER,
        links=links,
        attributes={
            **execution_attributes(
                tenant=job["tenant_id"],
                job_id=job_id,
                execution_id=str(execution_id),
                attempt=1,
                pool=job["pool"],
                handler=job["handler"],
            ),
            **kafka_publish_attributes(topic, str(execution_id)),
            **extra,
        },
    )


class WaitingWorkSource:
    """The common steps of a dispatch source (:mod:`sundial_dispatcher.sources`) whose work waits in Postgres.

    ``what`` names it in the outbox sender's spans and metrics, ``noun`` in its log lines."""

    what = ""
    noun = ""

    def __init__(
        self,
        shard: int,
        token: int,
        holder: str,
        outbox: DispatchStore,
        publisher: Publisher,
        config: WaitingWorkConfig,
        clock: Clock | None,
        limits: Limits | None,
    ) -> None:
        self.shard = shard
        self.token = token
        self.holder = holder
        self.outbox = outbox
        self.sender = OutboxSender(publisher, self.what, token)
        self.clock = clock or SystemClock()
        #: Fair dispatch's limits (none when fairness is off: the work goes out as it comes).
        self.limits = limits or NoLimits()
        self.cadence = Cadence(config.interval_sec, config.idle_interval_sec, self.clock)

    async def has_work(self) -> bool:
        """Whether anything waits on the shard (one cheap query)."""
        raise NotImplementedError

    async def claim(self) -> Room | None:
        if not await self.has_work():
            return None
        return await self.limits.room()

    async def put_back(self, claimed: Room) -> None:
        """Nothing: the work still waits in Postgres."""

    def committed(
        self, created: Sequence[FirstAttempt], spans: Mapping[UUID, Span], took: Iterable[tuple[str, str]], room: Room
    ) -> None:
        """After the commit: its executions' rate tokens taken from ``room``; the spans of what the planner planned
        and the store did not create (it existed already) ended."""
        self.limits.took(took, room)
        if created:
            crash_point(f"{self.what}s.after_commit")  # committed, not published: the sweeper's to send
        end_duplicates(spans, {p.execution_id for p in created})

    async def publish(
        self, created: Sequence[FirstAttempt], jobs: Sequence[tuple[Record, UUID]], spans: Mapping[UUID, Span]
    ) -> tuple[int, int]:
        """Send the committed first attempts (each of the job ``jobs[i]``: its row and id); (sent, failed)."""
        count_dispatched((job["tenant_id"], job["pool"]) for job, _ in jobs)
        sent = await self.sender.send(
            [self._message(p, job, job_id) for p, (job, job_id) in zip(created, jobs, strict=True)],
            [p.execution_id for p in created],
            [spans[p.execution_id] for p in created],
            mark=self.outbox.mark_published,
        )
        if sent.failed:
            log.warning(
                "shard %d: %d %s publishes failed; the sweeper will send them", self.shard, sent.failed, self.noun
            )
        return len(sent.sent), sent.failed

    def _message(self, p: FirstAttempt, job: Record, job_id: UUID) -> ExecutionMessage:
        return ExecutionMessage(
            execution_id=str(p.execution_id),
            job_id=str(job_id),
            tenant_id=job["tenant_id"],
            pool=job["pool"],
            handler=job["handler"],
            attempt=1,
            fence_token=self.sender.fence_token,
            scheduled_for=p.scheduled_for.isoformat(),
            timeout_sec=job["timeout_sec"],
            payload=job["payload"],
            traceparent=p.traceparent,
        )
