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

The handler's slot frees as soon as it ends; its outcome goes to the
:class:`~sundial_worker.inflight.OutcomeBuffer` for the flusher. At shutdown,
:meth:`HandlerExecutor.finish` gives running handlers the shutdown grace and abandons the rest.

There is no periodic loop here, so no ``run_once``: the work arrives from admission, one launch per won
execution; each handler task is named after its handler and execution, and one that dies with an
exception (a bug here: every handler error becomes an outcome) fails the runtime through ``on_failure``.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import re
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import orjson
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
from sundial_common.security.encryption import (
    LOG_TAIL,
    PAYLOAD,
    PROGRESS,
    RESULT,
    TRACEBACK,
    DecryptionError,
    Keyring,
    TenantCipher,
)
from sundial_common.stores.executions import Outcome
from sundial_common.stores.types import Record

from sundial_worker.consumer import Delivery, consumer_group
from sundial_worker.errors import check_positive_int, check_seconds
from sundial_worker.inflight import FinishedAttempt, InFlight, OutcomeBuffer, Running, WorkerStats
from sundial_worker.log_tail import log_tail, traceback_text
from sundial_worker.metrics import ExecutionMetrics
from sundial_worker.sdk import Context, HandlerSpec, HeartbeatSink, Worker, context_logger

log = logging.getLogger("sundial.worker")
handler_log = logging.getLogger("sundial.worker.handler")

_MAX_ERROR_CHARS = 8192
# orjson writes NUL as \u0000, which Postgres jsonb rejects; an even run of backslashes before it
# would be an escaped backslash followed by the literal text "u0000", which is fine.
_JSON_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


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
        self._keyring = keyring
        self.worker_id = worker_id
        self.config = config
        self._inflight = inflight
        self._outcomes = outcomes
        self._heartbeats = heartbeats
        self._stats = stats
        self._on_failure = on_failure
        self._threads: ThreadPoolExecutor | None = None
        self._sync_calls: set[Future[Any]] = set()
        #: The event loop the handlers run on, bound at the first launch. Named rather than looked up per execution:
        #: asyncio's lookup of the running loop asks the kernel for the process id each time (a getpid system call,
        #: three per execution: ~6 % of a worker's event-loop thread at 2,500/s in a native py-spy profile).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._metrics = ExecutionMetrics(worker.pool, frozenset(worker.registry.names()))

    def open(self) -> None:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(
                max_workers=self.config.concurrency, thread_name_prefix="sundial-handler"
            )

    def close(self) -> None:
        if self._threads is not None:
            # Don't wait: an abandoned sync handler may never return.
            self._threads.shutdown(wait=False, cancel_futures=True)
            self._threads = None
        self._loop = None

    @property
    def stuck_sync_handlers(self) -> int:
        """Sync handler threads still running although nobody waits for them (timed out or abandoned)."""
        running_sync = sum(1 for r in self._inflight.running.values() if not self._runs_async(r))
        return max(0, sum(1 for f in list(self._sync_calls) if not f.done()) - running_sync)

    def _runs_async(self, running: Running) -> bool:
        spec = self.worker.registry.get(running.message.handler)
        return spec is None or spec.is_async

    def launch(self, execution_id: UUID, message: ExecutionMessage, deliveries: list[Delivery], row: Record) -> None:
        """Start the handler of an execution whose start CAS this worker won (``row`` is what the CAS returned)."""
        due = row.get("fire_at") or row["scheduled_for"]
        running = Running(execution_id, message.attempt, message, deliveries, due=due)
        self._inflight.add(running)
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
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
        try:
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
        self._outcomes.put(FinishedAttempt(outcome, running.deliveries, logger, running.span_context))

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
        cipher = self._cipher(row["tenant_id"])
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
                    outcome = await self._invoke(spec, ctx, message, handler_span, running)
            else:
                outcome = await self._invoke(spec, ctx, message, span, running)
        except asyncio.CancelledError:
            span.set_attribute("sundial.outcome", "ABANDONED")
            raise
        if outcome.state in ("FAILED", "TIMED_OUT"):
            span.set_status(Status(StatusCode.ERROR, outcome.error or outcome.state))
            # The backoff is the worker's to compute (the policy's jitter); Postgres decides whether
            # attempts are left and adds it to its own clock.
            policy = RetryPolicy.from_json(row.get("retry_policy"))
            outcome = dataclasses.replace(outcome, retry_delay_ms=policy.delay_ms(running.attempt))
        span.set_attribute("sundial.outcome", outcome.state)
        return outcome, logger

    async def _invoke(
        self, spec: HandlerSpec | None, ctx: Context, message: ExecutionMessage, span: Span, running: Running
    ) -> Outcome:
        cipher = self._cipher(ctx.tenant)

        def outcome(state: str, result: Any = None, error: str | None = None, traceback: str | None = None) -> Outcome:
            # Sealed before they leave the handler's hands: Postgres (and the DLQ) only see ciphertext.
            return Outcome(
                ctx.execution_id,
                ctx.attempt,
                state,
                cipher.seal_json(result, RESULT),
                cipher.seal_error(error),
                traceback=cipher.seal_json(traceback, TRACEBACK),
                log_tail=cipher.seal_json(log_tail(ctx.logger), LOG_TAIL),
            )

        if spec is None:
            self._metrics.handler_started(ctx, running.due, None)  # lateness still counts; handler "other"
            error = self.worker.registry.unknown_handler_error(message.handler)
            ctx.logger.error("%s", error)
            span.set_status(Status(StatusCode.ERROR, error))
            self._stats.failed += 1
            return outcome("FAILED", error=error)
        timeout = message.timeout_sec if message.timeout_sec and message.timeout_sec > 0 else None
        if handler_log.isEnabledFor(logging.DEBUG):  # the adapter's own check costs more, once per execution
            ctx.logger.debug("running handler %s", spec.name)
        # The handler runs as a task of its own, so that a timeout or a cancel can interrupt it and still
        # give it the cancel grace to clean up, while this task decides the outcome.
        try:
            payload = cipher.open_json(message.payload, PAYLOAD)
        except DecryptionError as exc:  # tampered with, or copied from another tenant's job: never run it
            ctx.logger.error("%s", exc)
            span.set_status(Status(StatusCode.ERROR, str(exc)))
            self._stats.failed += 1
            return outcome("FAILED", error=f"DecryptionError: {exc}")
        work = self._start_handler(spec, ctx, payload)
        self._metrics.handler_started(ctx, running.due, work)
        try:
            interrupted = await self._wait_handler(work, running, timeout)
        except asyncio.CancelledError:  # the shutdown grace ran out: the handler is abandoned with us
            work.cancel()
            raise
        if interrupted is not None:
            return await self._interrupt(spec, ctx, span, work, interrupted, timeout, outcome)
        try:
            result = work.result()
        except asyncio.CancelledError as exc:  # the handler cancelled itself (or something it awaited)
            return self._handler_failed(ctx, span, exc, outcome)
        except Exception as exc:
            return self._handler_failed(ctx, span, exc, outcome)
        encoded, problem = encode_result(result)
        if problem is not None:
            ctx.logger.error("%s", problem)
            span.set_status(Status(StatusCode.ERROR, problem))
            self._stats.failed += 1
            return outcome("FAILED", error=problem)
        self._stats.succeeded += 1
        return outcome("SUCCEEDED", result=encoded)

    def _cipher(self, tenant: str) -> TenantCipher:
        cipher = self._keyring.cached(tenant)
        assert cipher is not None  # admission loads the keys of a batch's tenants before its start CAS
        return cipher

    def _start_handler(self, spec: HandlerSpec, ctx: Context, payload: Any) -> asyncio.Future[Any]:
        if spec.is_async:
            assert self._loop is not None  # bound by launch()
            # An async handler is a coroutine function (sdk._is_async): its task straight from the loop, without
            # asyncio.ensure_future's checks of what it was given.
            return self._loop.create_task(spec.func(ctx, payload))
        return self._submit_sync(spec, ctx, payload)

    @staticmethod
    async def _wait_handler(work: asyncio.Future[Any], running: Running, limit_sec: float | None) -> str | None:
        """Wait for the handler to end; None if it did, else why it must be interrupted (timeout, cancel).

        One future woken by whichever comes first — the handler's end, its timeout, a cancel request
        (:meth:`~sundial_worker.inflight.InFlight.request_cancel`) — rather than ``asyncio.wait`` on a task
        waiting for the cancel event: that task was a tenth of a worker's CPU per execution (py-spy, a steady 2,500/s).
        """
        if running.cancel_requested:
            return "cancel"
        loop = work.get_loop()
        woken: asyncio.Future[None] = loop.create_future()

        def wake(_: object = None) -> None:
            if not woken.done():
                woken.set_result(None)

        work.add_done_callback(wake)
        timer = loop.call_later(limit_sec, wake) if limit_sec is not None else None
        running.wake = wake
        try:
            await woken
        finally:
            running.wake = None
            work.remove_done_callback(wake)
            if timer is not None:
                timer.cancel()
        if work.done():
            return None
        return "cancel" if running.cancel_requested else "timeout"

    async def _interrupt(
        self,
        spec: HandlerSpec,
        ctx: Context,
        span: Span,
        work: asyncio.Future[Any],
        why: str,
        limit_sec: float | None,
        outcome: Callable[..., Outcome],
    ) -> Outcome:
        """Stop a handler at its timeout or on a cancel: ``ctx.cancelled``, cancel its task, wait the grace."""
        ctx.request_cancel()
        if spec.is_async:
            work.cancel()
        # A sync handler's future is its thread's: cancelling it would only stop us waiting, so it is left to
        # notice ctx.cancelled within the grace.
        done, _ = await asyncio.wait([work], timeout=self.config.cancel_grace_sec)
        if not done:
            # Whatever it ends with later is nobody's business any more; don't let asyncio complain about it.
            work.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._stats.abandoned_on_interrupt += 1
            ctx.logger.warning(
                "handler %s did not stop within %.1fs of being interrupted (%s); abandoned",
                spec.name,
                self.config.cancel_grace_sec,
                why,
            )
        elif not work.cancelled() and work.exception() is not None:
            ctx.logger.debug("interrupted handler raised %r", work.exception())
        if not spec.is_async and not done:
            ctx.logger.warning("the sync handler's thread keeps running until it returns; it cannot be interrupted")
        if why == "timeout":
            error = f"TimeoutError: handler {spec.name!r} exceeded timeoutSec={limit_sec:g}"
            ctx.logger.warning("%s", error)
            span.set_status(Status(StatusCode.ERROR, error))
            self._stats.timed_out += 1
            return outcome("TIMED_OUT", error=error)
        error = "Cancelled: the execution's cancel was requested"
        ctx.logger.info("handler %s cancelled on request", spec.name)
        self._stats.cancelled += 1
        return outcome("CANCELLED", error=error)

    def _handler_failed(self, ctx: Context, span: Span, exc: BaseException, outcome: Callable[..., Outcome]) -> Outcome:
        error = error_text(exc)
        # The traceback goes to the log, the span and, bounded and sealed, the attempt (GET /v1/executions/{id}).
        ctx.logger.warning("handler %s failed: %s", ctx.handler, error, exc_info=exc)
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, error))
        self._stats.failed += 1
        return outcome("FAILED", error=error, traceback=traceback_text(exc))

    def _submit_sync(self, spec: HandlerSpec, ctx: Context, payload: Any) -> asyncio.Future[Any]:
        assert self._threads is not None, "the executor is not open"
        # Copy the context so the handler's thread sees the handler span as current.
        future = self._threads.submit(contextvars.copy_context().run, spec.func, ctx, payload)
        # A thread cannot be interrupted: after a timeout or a shutdown cancel it runs on, and the
        # process must know (see stuck_sync_handlers) rather than hang at exit waiting for it.
        self._sync_calls.add(future)
        future.add_done_callback(self._sync_calls.discard)
        return asyncio.wrap_future(future, loop=self._loop)


def error_text(exc: BaseException) -> str:
    """What Postgres keeps of a handler's exception: ``Type: message``, NUL-free and bounded."""
    text = f"{type(exc).__name__}: {exc}".replace("\x00", "\\0")
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 1] + "…"


def encode_result(value: Any) -> tuple[Any, str | None]:
    """(value ready for the jsonb codec, problem); serialised once here, passed through as a Fragment."""
    if value is None:
        return None, None
    try:
        data = orjson.dumps(value)
    except TypeError as exc:
        return None, f"TypeError: handler result is not JSON-serializable: {exc}"
    if b"\\u0000" in data and _JSON_NUL.search(data):
        return None, "ValueError: handler result contains a NUL character (\\u0000), which Postgres cannot store"
    return orjson.Fragment(data), None
