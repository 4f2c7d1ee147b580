"""What the worker's loops share in memory: the executions this worker won and has not settled, the
outcomes waiting to be written, and the counters.

An execution is *running* from the moment this worker wins its start compare-and-swap until its handler
ends (it holds one of the ``concurrency`` handler slots), and *unsettled* until its outcome is in Postgres
(running, or finished and waiting for the flusher). Admission reads both (free slots; a redelivery of an
unsettled execution must wait for that write before its offset may commit), the executor adds executions
and ends them, handing each outcome to the :class:`OutcomeBuffer`; the flusher writes the buffer and settles
them, and the cancel loop reads the running ones.
Everything here is touched from the event loop's thread only, except :meth:`InFlight.unsettled_ids`: the
liveness thread (:mod:`sundial_worker.heartbeats`) reads it, so that set alone is kept behind a lock. The liveness
keys cover the unsettled executions, not only the running ones: an execution whose handler ended is still RUNNING in
Postgres until its outcome is written, and under load that write can wait longer than the keys' TTL plus the
sweeper's confirmation (~10 s) — the sweeper would then end such an execution FAILED_WORKER_LOST, reject the outcome
written after, and run it again (reasoned, not observed).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from opentelemetry.trace import SpanContext
from sundial_common.broker.messages import ExecutionMessage
from sundial_common.stores.executions import Outcome

from sundial_worker.consumer import Delivery
from sundial_worker.sdk import Context


@dataclass(slots=True)
class WorkerStats:
    """Counters since start (what a test or a metrics exporter reads)."""

    consumed: int = 0
    started: int = 0
    duplicates: int = 0
    undecodable: int = 0
    succeeded: int = 0
    failed: int = 0
    timed_out: int = 0
    cancelled: int = 0
    #: Interrupted handlers (timeout, cancel) that had not ended after the cancel grace.
    abandoned_on_interrupt: int = 0
    #: Failed attempts whose next attempt was scheduled / executions that went DEAD.
    retries_scheduled: int = 0
    dead: int = 0
    rejected: int = 0
    #: Executions refused because the pool does not admit their tenant (handler never called).
    refused: int = 0
    abandoned: int = 0
    flushes: int = 0
    commits: int = 0


@dataclass(eq=False, slots=True)
class Running:
    """An execution this worker won and whose handler has not finished."""

    execution_id: UUID
    attempt: int
    message: ExecutionMessage
    deliveries: list[Delivery]
    task: asyncio.Task[None] | None = None
    ctx: Context | None = None
    #: True once the execution's cancel is requested: the handler is interrupted. A flag, not an event: nothing
    #: waits for it (:attr:`wake` wakes the executor), and an event per execution was an allocation for nothing.
    cancel_requested: bool = False
    #: Wakes the executor waiting for the handler (set while it waits): a cancel request calls it.
    wake: Callable[[], None] | None = None
    #: When the occurrence was due (its fire time): the start of its dispatch lateness.
    due: datetime | None = None
    #: Not launched before this instant (epoch seconds): claimed ahead of it (sundial_worker.holding).
    launch_at: float | None = None
    #: The attempt's process span, parent of the outcome write's span.
    span_context: SpanContext | None = None
    #: Set when the handler raised :class:`~sundial_worker.verdicts.Accepted`: how long its liveness is held.
    hold_sec: float | None = None


class InFlight:
    """The running and unsettled executions, and the signal that a handler slot freed."""

    def __init__(self) -> None:
        self.running: dict[UUID, Running] = {}
        # Won executions whose outcome is not in Postgres yet (running, or finished and waiting for
        # the flusher): a redelivery of one must wait for that write before its offset may commit.
        self.unsettled: dict[UUID, Running] = {}
        self.slot_freed = asyncio.Event()
        # The unsettled executions' ids again, for the liveness thread: it must not iterate ``unsettled`` while the
        # event loop changes it.
        self._ids: set[UUID] = set()
        self._ids_lock = threading.Lock()

    def add(self, running: Running) -> None:
        """The start CAS was won: the execution holds a slot until its handler ends."""
        self.running[running.execution_id] = running
        self.unsettled[running.execution_id] = running
        with self._ids_lock:
            self._ids.add(running.execution_id)

    def end(self, execution_id: UUID) -> None:
        """The handler ended: its slot frees now; the outcome's write and commit follow in batches."""
        self.running.pop(execution_id, None)
        self.slot_freed.set()

    def unsettled_ids(self) -> list[UUID]:
        """The unsettled executions' ids (their liveness keys are renewed); safe to call from any thread."""
        with self._ids_lock:
            return list(self._ids)

    def settle(self, execution_id: UUID) -> None:
        """The outcome is written (or rejected): a redelivery no longer waits for it, and its key is not renewed."""
        self.unsettled.pop(execution_id, None)
        with self._ids_lock:
            self._ids.discard(execution_id)

    def not_cancelled(self) -> list[UUID]:
        """Running executions whose cancel has not been requested yet."""
        return [r.execution_id for r in self.running.values() if not r.cancel_requested]

    def request_cancel(self, execution_ids: Sequence[UUID]) -> int:
        """Interrupt the handlers of these executions (``ctx.cancelled``, then their task is cancelled)."""
        for execution_id in execution_ids:
            running = self.running.get(execution_id)
            if running is None or running.cancel_requested:
                continue
            if running.ctx is not None:
                running.ctx.request_cancel()
                running.ctx.logger.info("cancel requested: interrupting the handler")
            running.cancel_requested = True
            if running.wake is not None:
                running.wake()
        return len(execution_ids)


@dataclass(eq=False, slots=True)
class FinishedAttempt:
    """A handler's outcome, waiting to be written, with the deliveries to acknowledge after the write."""

    outcome: Outcome
    deliveries: list[Delivery]
    logger: logging.LoggerAdapter[logging.Logger]
    #: The attempt's process span: the outcome write is its child, in the execution's trace.
    span_context: SpanContext | None = None
    #: An accepted attempt (its outcome's state ``ACCEPTED``): nothing is written, its liveness is held this long.
    hold_sec: float | None = None


class OutcomeBuffer:
    """Outcomes of ended handlers, in the order they ended, until the flusher has written them."""

    def __init__(self, max_outcomes: int) -> None:
        self.items: list[FinishedAttempt] = []
        self._max_outcomes = max_outcomes
        #: Set when an outcome arrives (the flusher sleeps on it while the buffer is empty).
        self.ready = asyncio.Event()
        #: Set when a full batch is waiting (the flusher stops waiting for company).
        self.full = asyncio.Event()

    def put(self, finished: FinishedAttempt) -> None:
        self.items.append(finished)
        self.ready.set()
        if len(self.items) >= self._max_outcomes:
            self.full.set()

    def __len__(self) -> int:
        return len(self.items)
