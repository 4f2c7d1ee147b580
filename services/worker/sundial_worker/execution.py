"""Running handlers: one task per won execution, its timeout and cancel, and its outcome.

:meth:`HandlerExecutor.launch` starts a won execution's handler as a task of its own (an async handler
on the event loop, a sync one in the executor's thread pool — the runtime's one sync/async bridge)
inside a consumer span linked to the dispatcher's trace. The handler gets a
:class:`~sundial_worker.sdk.Context` whose ``heartbeat`` goes to the heartbeat loop.

Ending an attempt. A handler that returns is SUCCEEDED; one that raises, FAILED. At the job's
``timeoutSec``, or when its execution's cancel is requested, the handler is interrupted: ``ctx.cancelled``
turns true and its task is cancelled (a sync handler's thread cannot be, and must look at
``ctx.cancelled``); a handler that has not ended ``cancel_grace_sec`` later is abandoned. The attempt is
TIMED_OUT or CANCELLED either way. A FAILED or TIMED_OUT attempt carries the backoff of the job's retry
policy, which Postgres applies when the flusher writes the outcome.

Calling the handler itself — its thread or task, its timeout and cancel, the sealed outcome — is
:class:`~sundial_worker.invocation.HandlerInvoker`'s.

The handler's slot frees as soon as it ends; its outcome goes to the
:class:`~sundial_worker.inflight.OutcomeBuffer` for the flusher. At shutdown,
:meth:`HandlerExecutor.finish` gives running handlers the shutdown grace and abandons the rest.

There is no periodic loop here, so no ``run_once``: the work arrives from admission, one launch per won
execution; each handler task is named after its handler and execution, and one that dies with an
exception (a bug here: every handler error becomes an outcome) fails the runtime through ``on_failure``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from sundial_common.broker.messages import ExecutionMessage
from sundial_common.domain.retry_policy import RetryPolicy
from sundial_common.observability.tracing import (
    execution_attributes,
    execution_context,
    spans_recorded,
    trace_id_hex,
    tracer,
    unrecorded_span,
)
from sundial_common.security.encryption import PROGRESS, Keyring
from sundial_common.stores.executions import Outcome
from sundial_common.stores.types import Record

from sundial_worker.consumer import Delivery, consumer_group
from sundial_worker.errors import check_positive_int, check_seconds
from sundial_worker.inflight import FinishedAttempt, InFlight, OutcomeBuffer, Running, WorkerStats
from sundial_worker.invocation import HandlerInvoker
from sundial_worker.sdk import Context, HeartbeatSink, Worker, context_logger

log = logging.getLogger("sundial.worker")
handler_log = logging.getLogger("sundial.worker.handler")


@dataclass(frozen=True, slots=True)
class ExecutionConfig:
    """How handlers run. Validated at construction."""

    concurrency: int = 16
    """Handlers running at once; also the threads of the pool that runs sync handlers."""
    cancel_grace_sec: float = 5.0
    """How long an interrupted handler (timeout or cancel) may take to end before it is abandoned."""

    def __post_init__(self) -> None:
        check_positive_int(self, "concurrency")
        check_seconds(self, "cancel_grace_sec", zero_ok=True)


class HandlerExecutor:
    """Runs the handlers of won executions and turns each into an outcome."""

    def __init__(
        self,
        worker: Worker,
        worker_id: str,
        config: ExecutionConfig,
        *,
        inflight: InFlight,
        outcomes: OutcomeBuffer,
        heartbeats: HeartbeatSink,
        stats: WorkerStats,
        keyring: Keyring,
        on_failure: Callable[[str, BaseException], None],
    ) -> None:
        self.worker = worker
        self.worker_id = worker_id
        self.config = config
        self._inflight = inflight
        self._outcomes = outcomes
        self._heartbeats = heartbeats
        self._stats = stats
        self._on_failure = on_failure
        self._invoker = HandlerInvoker(
            worker,
            concurrency=config.concurrency,
            cancel_grace_sec=config.cancel_grace_sec,
            stats=stats,
            keyring=keyring,
        )
        #: The event loop the handlers run on, bound at the first launch (and named for the same reason as the
        #: invoker's: looking it up per execution costs a getpid system call each time).
        self._loop: asyncio.AbstractEventLoop | None = None

    def open(self) -> None:
        self._invoker.open()

    def close(self) -> None:
        self._invoker.close()
        self._loop = None

    @property
    def stuck_sync_handlers(self) -> int:
        """Sync handler threads still running although nobody waits for them (timed out or abandoned)."""
        running_sync = sum(1 for r in self._inflight.running.values() if not self._runs_async(r))
        return max(0, self._invoker.sync_calls_running - running_sync)

    def _runs_async(self, running: Running) -> bool:
        spec = self.worker.registry.get(running.message.handler)
        return spec is None or spec.is_async

    def launch(
        self,
        execution_id: UUID,
        message: ExecutionMessage,
        deliveries: list[Delivery],
        row: Record,
        *,
        at: float | None = None,
    ) -> None:
        """Start the handler of an execution whose start CAS this worker won (``row`` is what the CAS returned);
        ``at``: not before this instant (epoch seconds: a message published ahead, claimed just before it)."""
        due = row.get("fire_at") or row["scheduled_for"]
        running = Running(execution_id, message.attempt, message, deliveries, due=due, launch_at=at)
        self._inflight.add(running)
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
            self._invoker.bind(loop)
        # The message's own text of the id: the same as str(execution_id), without formatting the UUID again.
        task = loop.create_task(self._execute(running, row), name=f"handler {message.handler} {message.execution_id}")
        running.task = task
        task.add_done_callback(self._on_handler_done)

    def refuse(
        self, execution_id: UUID, message: ExecutionMessage, deliveries: list[Delivery], row: Record, error: str
    ) -> None:
        """End a won execution FAILED with ``error`` without calling its handler (its tenant may not use this
        pool: :mod:`~sundial_worker.pool_guard`). Its retry policy applies as to any failure."""
        running = Running(execution_id, message.attempt, message, deliveries)
        self._inflight.add(running)  # settled by the flusher like any outcome
        self._inflight.end(execution_id)
        logger = context_logger(
            handler_log,
            tenant=row["tenant_id"],
            job_id=row["job_id"],
            execution_id=execution_id,
            attempt=message.attempt,
            trace_id=row.get("trace_id"),
        )
        # The audit trail records this refusal too once it exists (see docs/guides/tenants.md, "Pools").
        logger.warning("%s: handler %s not called", error, message.handler)
        self._stats.refused += 1
        self._stats.failed += 1
        policy = RetryPolicy.from_json(row.get("retry_policy"))
        outcome = Outcome(execution_id, message.attempt, "FAILED", None, error, policy.delay_ms(message.attempt))
        self._outcomes.put(FinishedAttempt(outcome, deliveries, logger, None))

    def _on_handler_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        if (exc := task.exception()) is not None:
            # _execute turns every handler error into an outcome; an exception here is our bug.
            self._on_failure(f"handler task {task.get_name()}", exc)

    async def finish(self, grace_sec: float, force: asyncio.Event) -> list[UUID]:
        """Wait up to ``grace_sec`` (or until ``force``) for running handlers; cancel the rest.

        Returns the executions abandoned: they stay RUNNING in Postgres for the sweeper.
        """
        tasks = [r.task for r in self._inflight.running.values() if r.task is not None]
        if not tasks:
            return []
        log.info("waiting up to %.1fs for %d running handlers", grace_sec, len(tasks))
        # "All handlers done, or forced": asyncio.wait(tasks) as one future (waiting on it never
        # cancels the handlers themselves), raced against the force event, bounded by the grace.
        all_done = asyncio.ensure_future(asyncio.wait(tasks))
        forced = asyncio.ensure_future(force.wait())
        try:
            await asyncio.wait([all_done, forced], timeout=grace_sec, return_when=asyncio.FIRST_COMPLETED)
        finally:
            all_done.cancel()
            forced.cancel()
        left = [t for t in tasks if not t.done()]
        if not left:
            return []
        abandoned = [r for r in self._inflight.running.values() if r.task in left]
        for running in abandoned:
            logger = running.ctx.logger if running.ctx else log
            logger.warning("abandoning handler after the shutdown grace; the execution stays RUNNING for the sweeper")
        self._stats.abandoned += len(abandoned)
        ids = [r.execution_id for r in abandoned]
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        return ids

    # --- one handler ------------------------------------------------------------------------

    async def _execute(self, running: Running, row: Record) -> None:
        message = running.message
        delivery = running.deliveries[0]
        # The Kafka header is this attempt's send span; a republished message carries the row's.
        parent = delivery.traceparent or message.traceparent
        launched = None
        try:
            if running.launch_at is not None:
                if (wait := running.launch_at - time.time()) > 0:
                    await asyncio.sleep(wait)  # claimed ahead of its instant (sundial_worker.holding)
                launched = datetime.now(UTC)  # its start as it happened, written with the outcome
            if spans_recorded():
                with tracer.start_as_current_span(
                    f"process {delivery.topic}",
                    context=execution_context(parent),
                    kind=SpanKind.CONSUMER,
                    attributes={
                        "messaging.system": "kafka",
                        "messaging.operation.type": "process",
                        "messaging.operation.name": "process",
                        "messaging.destination.name": delivery.topic,
                        "messaging.consumer.group.name": consumer_group(self.worker.pool),
                        "messaging.destination.partition.id": str(delivery.partition),
                        "messaging.kafka.offset": delivery.offset,
                        "messaging.kafka.message.key": message.execution_id,
                        **self._attributes(message),
                        "sundial.fence_token": message.fence_token,
                        "sundial.worker_id": self.worker_id,
                    },
                    record_exception=False,
                    set_status_on_exception=False,
                ) as span:
                    running.span_context = span.get_span_context()
                    outcome, logger = await self._attempt(running, row, span, traced=True)
            else:
                # Nothing is recorded (no OTLP endpoint): no spans are built, but the handler still runs inside
                # the execution's trace (its instrumented calls propagate the traceparent), and its logs carry
                # the trace id.
                span = unrecorded_span(parent)
                token = otel_context.attach(trace.set_span_in_context(span, otel_context.Context()))
                try:
                    outcome, logger = await self._attempt(running, row, span, traced=False)
                finally:
                    otel_context.detach(token)
        finally:
            self._inflight.end(running.execution_id)
        # Its end as it happened: the write waits for company (sundial_worker.outcomes).
        outcome = dataclasses.replace(outcome, started_at=launched, finished_at=datetime.now(UTC))
        self._outcomes.put(
            FinishedAttempt(outcome, running.deliveries, logger, running.span_context, hold_sec=running.hold_sec)
        )

    def _attributes(self, message: ExecutionMessage) -> dict[str, str | int]:
        return execution_attributes(
            tenant=message.tenant_id,
            job_id=message.job_id,
            execution_id=message.execution_id,
            attempt=message.attempt,
            pool=self.worker.pool,
            handler=message.handler,
        )

    async def _attempt(
        self, running: Running, row: Record, span: Span, *, traced: bool
    ) -> tuple[Outcome, logging.LoggerAdapter[logging.Logger]]:
        """Run one attempt's handler under the process ``span`` (in its own span if ``traced``): its outcome."""
        message = running.message
        spec = self.worker.registry.get(message.handler)
        context = span.get_span_context()
        trace_id = trace_id_hex(span) if context.is_valid else row["trace_id"]
        logger = context_logger(
            handler_log,
            tenant=row["tenant_id"],
            job_id=row["job_id"],
            execution_id=running.execution_id,
            attempt=running.attempt,
            trace_id=trace_id,
        )
        cipher = self._invoker.cipher(row["tenant_id"])
        ctx = Context(
            execution_id=running.execution_id,
            job_id=row["job_id"],
            tenant=row["tenant_id"],
            attempt=running.attempt,
            fence_token=message.fence_token,
            scheduled_for=row["scheduled_for"],
            handler=message.handler,
            pool=self.worker.pool,
            trace_id=trace_id,
            logger=logger,
            previous_progress=cipher.open_json(row.get("previous_progress"), PROGRESS),
            timeout_sec=message.timeout_sec or None,
            _sink=self._heartbeats,
        )
        running.ctx = ctx
        if running.cancel_requested:  # asked to stop before it even started
            ctx.request_cancel()
        try:
            if traced:
                # The handler's span is current while it runs (its task copies this context), so the
                # handler's own instrumented calls (httpx, asyncpg, …) continue the execution's trace.
                with tracer.start_as_current_span(
                    message.handler,
                    attributes=self._attributes(message),
                    record_exception=False,
                    set_status_on_exception=False,
                ) as handler_span:
                    outcome = await self._invoker.invoke(spec, ctx, message, handler_span, running)
            else:
                outcome = await self._invoker.invoke(spec, ctx, message, span, running)
        except asyncio.CancelledError:
            span.set_attribute("sundial.outcome", "ABANDONED")
            raise
        if outcome.state in ("FAILED", "TIMED_OUT"):
            span.set_status(Status(StatusCode.ERROR, outcome.error or outcome.state))
            # The backoff is the worker's to compute (the policy's jitter); Postgres decides whether
            # attempts are left and adds it to its own clock. A handler's verdict (verdicts.py) set its own.
            if not outcome.retry_delay_ms:
                policy = RetryPolicy.from_json(row.get("retry_policy"))
                outcome = dataclasses.replace(outcome, retry_delay_ms=policy.delay_ms(running.attempt))
        span.set_attribute("sundial.outcome", outcome.state)
        return outcome, logger
