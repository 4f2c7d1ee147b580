"""Calling one attempt's handler: its thread or task, its timeout and cancel, and the sealed outcome it ends with.

:class:`HandlerInvoker` is what :class:`~sundial_worker.execution.HandlerExecutor` hands a prepared
:class:`~sundial_worker.sdk.Context` to. It starts the handler (an async handler as a task on the event loop, a
sync one in the pool of handler threads — the runtime's one sync/async bridge), waits for whichever comes first
of its end, its ``timeoutSec`` and a cancel request, interrupts it if need be (``ctx.cancelled``, its task
cancelled, ``cancel_grace_sec`` to end before it is abandoned), and turns how it ended into an
:class:`~sundial_common.stores.executions.Outcome` whose result, error, traceback and log tail are sealed with the
tenant's key before they leave. The attempt's bookkeeping (in flight, spans, the retry backoff, the outcome
buffer) stays the executor's.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import re
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import orjson
from opentelemetry.trace import Span, Status, StatusCode
from sundial_common.broker.messages import ExecutionMessage
from sundial_common.security.encryption import (
    LOG_TAIL,
    PAYLOAD,
    RESULT,
    TRACEBACK,
    DecryptionError,
    Keyring,
    TenantCipher,
)
from sundial_common.stores.executions import NO_RETRY, Outcome

from sundial_worker.inflight import Running, WorkerStats
from sundial_worker.log_tail import log_tail, traceback_text
from sundial_worker.metrics import ExecutionMetrics
from sundial_worker.sdk import Context, HandlerSpec, Worker
from sundial_worker.verdicts import ACCEPTED, Accepted, NoRetry, RetryAfter

handler_log = logging.getLogger("sundial.worker.handler")

_MAX_ERROR_CHARS = 8192
# orjson writes NUL as \u0000, which Postgres jsonb rejects; an even run of backslashes before it
# would be an escaped backslash followed by the literal text "u0000", which is fine.
_JSON_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


class HandlerInvoker:
    """Calls handlers and waits for them, and seals how each ended into an outcome."""

    def __init__(
        self, worker: Worker, *, concurrency: int, cancel_grace_sec: float, stats: WorkerStats, keyring: Keyring
    ) -> None:
        self.worker = worker
        self._concurrency = concurrency
        self._cancel_grace_sec = cancel_grace_sec
        self._stats = stats
        self._keyring = keyring
        self._threads: ThreadPoolExecutor | None = None
        self._sync_calls: set[Future[Any]] = set()
        #: The event loop the handlers run on (:meth:`bind`). Named rather than looked up per execution:
        #: asyncio's lookup of the running loop asks the kernel for the process id each time (a getpid system call,
        #: three per execution: ~6 % of a worker's event-loop thread at 2,500/s in a native py-spy profile).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._metrics = ExecutionMetrics(worker.pool, frozenset(worker.registry.names()))

    def open(self) -> None:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max_workers=self._concurrency, thread_name_prefix="sundial-handler")

    def close(self) -> None:
        if self._threads is not None:
            # Don't wait: an abandoned sync handler may never return.
            self._threads.shutdown(wait=False, cancel_futures=True)
            self._threads = None
        self._loop = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop the handlers' tasks run on."""
        self._loop = loop

    @property
    def sync_calls_running(self) -> int:
        """Sync handler calls whose thread has not returned yet (whether or not anyone still waits for them)."""
        return sum(1 for f in list(self._sync_calls) if not f.done())

    def cipher(self, tenant: str) -> TenantCipher:
        cipher = self._keyring.cached(tenant)
        assert cipher is not None  # admission loads the keys of a batch's tenants before its start CAS
        return cipher

    async def invoke(
        self, spec: HandlerSpec | None, ctx: Context, message: ExecutionMessage, span: Span, running: Running
    ) -> Outcome:
        """Run the handler ``spec`` (None: not registered here) of one attempt; how it ended, sealed."""
        cipher = self.cipher(ctx.tenant)

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
        except Accepted as exc:
            running.hold_sec = exc.hold_sec
            ctx.logger.info("handler %s: %s; the attempt stays RUNNING for %gs", ctx.handler, exc, exc.hold_sec)
            return Outcome(ctx.execution_id, ctx.attempt, ACCEPTED)
        except (RetryAfter, NoRetry) as exc:
            failed = self._handler_failed(ctx, span, exc, outcome, traceback=False)
            # At least 1 ms: zero is "not set" (the policy's backoff applies).
            delay = NO_RETRY if isinstance(exc, NoRetry) else max(1, round(exc.delay_sec * 1000))
            return dataclasses.replace(failed, retry_delay_ms=delay)
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

    def _start_handler(self, spec: HandlerSpec, ctx: Context, payload: Any) -> asyncio.Future[Any]:
        if spec.is_async:
            assert self._loop is not None  # bound by the executor's first launch
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
        done, _ = await asyncio.wait([work], timeout=self._cancel_grace_sec)
        if not done:
            # Whatever it ends with later is nobody's business any more; don't let asyncio complain about it.
            work.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._stats.abandoned_on_interrupt += 1
            ctx.logger.warning(
                "handler %s did not stop within %.1fs of being interrupted (%s); abandoned",
                spec.name,
                self._cancel_grace_sec,
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

    def _handler_failed(
        self, ctx: Context, span: Span, exc: BaseException, outcome: Callable[..., Outcome], *, traceback: bool = True
    ) -> Outcome:
        """``traceback`` False: a verdict (verdicts.py) the handler meant, whose message says it all."""
        error = error_text(exc) if traceback else str(exc)
        # The traceback goes to the log, the span and, bounded and sealed, the attempt (GET /v1/executions/{id}).
        ctx.logger.warning("handler %s failed: %s", ctx.handler, error, exc_info=exc if traceback else None)
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, error))
        self._stats.failed += 1
        return outcome("FAILED", error=error, traceback=traceback_text(exc) if traceback else None)

    def _submit_sync(self, spec: HandlerSpec, ctx: Context, payload: Any) -> asyncio.Future[Any]:
        assert self._threads is not None, "the executor is not open"
        # Copy the context so the handler's thread sees the handler span as current.
        future = self._threads.submit(contextvars.copy_context().run, spec.func, ctx, payload)
        # A thread cannot be interrupted: after a timeout or a shutdown cancel it runs on, and the
        # process must know (see HandlerExecutor.stuck_sync_handlers) rather than hang at exit waiting for it.
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
