"""The worker runtime: Kafka → start CAS → handler → batched outcome write → offset commit.

One :class:`WorkerRuntime` serves one :class:`~sundial_worker.sdk.Worker` (one pool). Four named side
tasks run beside the handlers, each a loop around a ``*_once()`` pass that tests can call directly
(CONVENTIONS 3), and a side task that dies fails the whole runtime loudly (CONVENTIONS 8):

``poll``
    Takes at most as many messages as there are free handler slots, decodes them, and claims the
    whole batch with ONE ``stores.executions.start_executions`` (compare-and-swap PENDING → RUNNING, DESIGN
    invariant 3). A message that loses the CAS — a duplicate delivery, an attempt that is no longer
    current — is acknowledged without running (invariant 5). Each won execution's handler starts as
    its own task.
``flush``
    Handlers hand their :class:`~sundial_common.stores.executions.Outcome` to a small buffer; the flusher writes
    it with ONE ``stores.executions.finish_attempts`` per flush (when ``flush_max_outcomes`` are waiting or
    ``flush_interval_sec`` after the first). Only then are the messages acknowledged to the consumer.
``commit``
    Every ``commit_interval_sec``, commits each partition's contiguous acknowledged prefix, so the
    offset never passes a message whose handler still runs or whose result is not in Postgres yet.
``heartbeat``
    Every ``heartbeat_interval_sec``, ONE Redis call renews ``sundial:hb:<execution id>`` for every
    running execution; the sweeper treats a RUNNING execution without that key as lost. The same pass
    asks Postgres which running executions have a cancel requested (the fallback for a lost Redis flag).
``cancel``
    Every ``cancel_poll_interval_sec``, ONE Redis call reads the cancel flags
    (``sundial:cancel:<execution id>``) of every running execution.

Ending an attempt. A handler that returns is SUCCEEDED; one that raises, FAILED. At the job's
``timeoutSec``, or when its execution's cancel is requested, the handler is interrupted: ``ctx.cancelled``
turns true and its task is cancelled (a sync handler's thread cannot be, and must look at
``ctx.cancelled``); a handler that has not ended ``cancel_grace_sec`` later is abandoned. The attempt is
TIMED_OUT or CANCELLED either way. A FAILED or TIMED_OUT attempt carries the backoff of the job's retry
policy: Postgres schedules the next attempt (or makes the execution DEAD after the last) in the same
compare-and-swap that records the outcome, and after the write the worker puts the retry's member into its
shard's hot window (best effort: the hydrator re-adds one that is missing).

So the only per-message round trip is the handler itself: starts, finishes and heartbeats travel in
batches.

Shutdown (SIGTERM/SIGINT in the CLI): stop taking messages, let running handlers finish for up to
``shutdown_grace_sec``, then cancel the rest — they stay RUNNING in Postgres and their offsets stay
uncommitted, so the sweeper (or the next member of the group) takes them over — then flush the
outcomes, commit, and leave the consumer group.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
import re
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any
from uuid import UUID

import asyncpg
import orjson
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError
from sundial_common.hotwindow import HotWindow
from sundial_common.messages import ExecutionMessage
from sundial_common.retry_policy import RetryPolicy
from sundial_common.settings import CommonSettings
from sundial_common.signals import cancel_key, heartbeat_key
from sundial_common.stores import Stores
from sundial_common.stores.executions import Finished, Outcome
from sundial_common.stores.types import Record, RetryDue
from sundial_common.telemetry import context_from, trace_id_hex, tracer

from sundial_worker.consumer import Delivery, ExecutionConsumer, KafkaExecutionConsumer
from sundial_worker.sdk import Context, HandlerSpec, Worker, context_logger

log = logging.getLogger("sundial.worker")
handler_log = logging.getLogger("sundial.worker.handler")

# Database errors worth waiting out (connection trouble, failover, overload, lock conflicts); any
# other error is a bug and fails the runtime loudly instead of retrying forever.
_TRANSIENT_DB_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.exceptions.TransactionRollbackError,
)
_REDIS_ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)
_MAX_ERROR_CHARS = 8192
_FINAL_FLUSH_SEC = 10.0
_BACKOFF_MAX_SEC = 5.0
# orjson writes NUL as \u0000, which Postgres jsonb rejects; an even run of backslashes before it
# would be an escaped backslash followed by the literal text "u0000", which is fine.
_JSON_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
# Renew many liveness keys in ONE command: a pipeline of SETs costs redis-py a pack and a parse per
# key, which at thousands of executions a second was most of the poll loop's CPU. The keys of one
# call may live on different Redis Cluster slots; Sundial runs one Redis (or a proxy) for them.
_RENEW = """
for i = 1, #KEYS do redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2]) end
return #KEYS
"""
# Drop liveness keys only where they are still ours: after a late (rejected) write, the sweeper may
# have handed the execution to another worker, whose key has the same name.
_RELEASE = """
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then n = n + redis.call('DEL', KEYS[i]) end
end
return n
"""
_RENEW_CHUNK = 1000
# Retries due a little past the hot window go in too: the hydrator's watermark may already have passed
# them (the API and the dispatcher use the same margin for jobs).
_HOT_WINDOW_MARGIN = timedelta(seconds=60)


class WorkerCrashed(RuntimeError):
    """A side task of the runtime died; the process should exit non-zero."""


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How one worker process runs its pool. Validated at construction."""

    concurrency: int = 16
    """Handlers running at once; also the most messages taken from Kafka that are not finished."""
    poll_batch: int = 256
    """Most messages taken per consume call (and so per start CAS round trip)."""
    poll_timeout_sec: float = 0.25
    """How long one consume call waits for a first message; bounds how fast the loop notices a stop."""
    heartbeat_interval_sec: float = 10.0
    """How often liveness keys of running executions are renewed."""
    heartbeat_ttl_sec: float = 30.0
    """Lifetime of a liveness key; the sweeper considers an execution lost once it expires."""
    commit_interval_sec: float = 0.5
    """How often the acknowledged offset prefix is committed to Kafka."""
    flush_max_outcomes: int = 256
    """Most outcomes written by one ``finish_executions`` (a full buffer is written at once)."""
    flush_interval_sec: float = 0.005
    """How long the first outcome of a flush waits for company."""
    shutdown_grace_sec: float = 30.0
    """How long a stop waits for running handlers before abandoning them to the sweeper."""
    db_pool_size: int = 8
    """Postgres connections (start/finish batches and handlers' progress writes)."""
    cancel_poll_interval_sec: float = 0.5
    """How often the cancel flags of running executions are read (a handler sees a cancel within this)."""
    cancel_grace_sec: float = 5.0
    """How long an interrupted handler (timeout or cancel) may take to end before it is abandoned."""

    def __post_init__(self) -> None:
        for name in ("concurrency", "poll_batch", "flush_max_outcomes", "db_pool_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"WorkerConfig.{name} must be a positive integer; got {value!r}")
        for name in (
            "poll_timeout_sec",
            "heartbeat_interval_sec",
            "heartbeat_ttl_sec",
            "commit_interval_sec",
            "cancel_poll_interval_sec",
        ):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"WorkerConfig.{name} must be a positive number of seconds; got {value!r}")
        for name in ("flush_interval_sec", "shutdown_grace_sec", "cancel_grace_sec"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                raise ValueError(f"WorkerConfig.{name} must be zero or more seconds; got {value!r}")
        if self.heartbeat_ttl_sec <= self.heartbeat_interval_sec:
            raise ValueError(
                f"WorkerConfig.heartbeat_ttl_sec ({self.heartbeat_ttl_sec}) must exceed heartbeat_interval_sec "
                f"({self.heartbeat_interval_sec}), or liveness keys expire between renewals"
            )

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


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
    abandoned: int = 0
    flushes: int = 0
    commits: int = 0


@dataclass(frozen=True, slots=True)
class PollResult:
    consumed: int = 0
    started: int = 0
    duplicates: int = 0


@dataclass(frozen=True, slots=True)
class FlushResult:
    written: int = 0
    rejected: int = 0


@dataclass(eq=False, slots=True)
class _Running:
    """An execution this worker won and whose handler has not finished."""

    execution_id: UUID
    attempt: int
    message: ExecutionMessage
    deliveries: list[Delivery]
    task: asyncio.Task[None] | None = None
    ctx: Context | None = None
    #: Set when the execution's cancel is requested: the handler is interrupted.
    cancel: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False, slots=True)
class _Finished:
    outcome: Outcome
    deliveries: list[Delivery]
    logger: logging.LoggerAdapter[logging.Logger]


@dataclass(eq=False, slots=True)
class _Claim:
    message: ExecutionMessage
    execution_id: UUID
    deliveries: list[Delivery] = field(default_factory=list)


class WorkerRuntime:
    """Runs one pool's handlers against Kafka, Postgres and Redis. Start/stop are idempotent."""

    def __init__(
        self,
        worker: Worker,
        settings: CommonSettings,
        *,
        config: WorkerConfig | None = None,
        worker_id: str | None = None,
        consumer: ExecutionConsumer | None = None,
    ) -> None:
        self.worker = worker
        self.settings = settings
        self.config = config or WorkerConfig(concurrency=worker.concurrency)
        self.worker_id = worker_id or settings.instance_id
        self.consumer: ExecutionConsumer = consumer or KafkaExecutionConsumer(
            settings.kafka_bootstrap, worker.pool, client_id=self.worker_id
        )
        self.stats = WorkerStats()
        self._stores: Stores | None = None
        self._redis: Redis | None = None
        self._renew_script: AsyncScript | None = None
        self._release_script: AsyncScript | None = None
        self._hot_window: HotWindow | None = None
        self._handler_threads: ThreadPoolExecutor | None = None
        self._running: dict[UUID, _Running] = {}
        # Won executions whose outcome is not in Postgres yet (running, or finished and waiting for
        # the flusher): a redelivery of one must wait for that write before its offset may commit.
        self._unsettled: dict[UUID, _Running] = {}
        self._finished: list[_Finished] = []
        self._finished_ready = asyncio.Event()
        self._flush_full = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._side_tasks: dict[str, asyncio.Task[None]] = {}
        self._crashed = asyncio.Event()
        self._failure: BaseException | None = None
        self._force = asyncio.Event()
        self._started = False
        self._stopping = False
        self._stopped = False
        self._draining = False
        self._sync_calls: set[Future[Any]] = set()
        self._stop_done = asyncio.Event()

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def ready(self) -> asyncio.Event:
        """Set when the consumer has its first partition assignment."""
        return self.consumer.ready

    @property
    def stores(self) -> Stores:
        if self._stores is None:
            raise RuntimeError("the worker runtime is not started")
        return self._stores

    @property
    def running(self) -> int:
        """Handlers running now."""
        return len(self._running)

    @property
    def stuck_sync_handlers(self) -> int:
        """Sync handler threads still running although nobody waits for them (timed out or abandoned)."""
        running_sync = sum(1 for r in self._running.values() if not self._runs_async(r))
        return max(0, sum(1 for f in list(self._sync_calls) if not f.done()) - running_sync)

    def _runs_async(self, running: _Running) -> bool:
        spec = self.worker.registry.get(running.message.handler)
        return spec is None or spec.is_async

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        log.info(
            "worker %s starting: pool %s, handlers %s, concurrency %d",
            self.worker_id,
            self.worker.pool,
            ", ".join(self.worker.registry.names()) or "none",
            self.config.concurrency,
        )
        try:
            self._stores = await Stores.connect(
                self.settings.database_url, min_size=1, max_size=self.config.db_pool_size
            )
            self._redis = Redis.from_url(
                self.settings.redis_url, socket_timeout=5, socket_connect_timeout=5, health_check_interval=30
            )
            self._renew_script = self._redis.register_script(_RENEW)
            self._release_script = self._redis.register_script(_RELEASE)
            self._hot_window = HotWindow(self._redis)
            self._handler_threads = ThreadPoolExecutor(
                max_workers=self.config.concurrency, thread_name_prefix="sundial-handler"
            )
            await self.consumer.open()
        except BaseException:
            await self._close_resources()
            self._stopped = True
            raise
        self._spawn("poll", self._poll_loop)
        self._spawn("flush", self._flush_loop)
        self._spawn("commit", self._commit_loop)
        self._spawn("heartbeat", self._heartbeat_loop)
        self._spawn("cancel", self._cancel_loop)

    async def stop(self) -> None:
        """Stop taking work, finish (or after the grace, abandon) running handlers, flush, commit, leave."""
        if not self._started or self._stopped:
            self._stopped = True
            return
        if self._stopping:
            await self._stop_done.wait()  # a second caller waits for the first stop to finish
            return
        self._stopping = True
        log.info("worker %s stopping: %d handlers running", self.worker_id, len(self._running))
        try:
            await self._stop_polling()
            await self._finish_handlers()
            await self._drain_outcomes()
            for name in ("commit", "heartbeat", "cancel"):
                await self._cancel_side_task(name)
            await self._close_resources()
        finally:
            self._stopped = True
            self._stop_done.set()
        counts = ", ".join(f"{f.name} {getattr(self.stats, f.name)}" for f in fields(self.stats))
        log.info("worker %s stopped: %s", self.worker_id, counts)

    def force_stop(self) -> None:
        """Cut the shutdown grace short (a second SIGINT/SIGTERM)."""
        self._force.set()

    async def __aenter__(self) -> WorkerRuntime:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def run_until(self, stop: asyncio.Event) -> None:
        """Start, serve until ``stop`` is set, then stop; raises :class:`WorkerCrashed` if a side task died."""
        await self.start()
        try:
            waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._crashed.wait())]
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
        finally:
            await self.stop()
        if self._failure is not None:
            raise WorkerCrashed(f"worker {self.worker_id} crashed: {self._failure!r}") from self._failure

    async def wait_crashed(self) -> BaseException | None:
        await self._crashed.wait()
        return self._failure

    # --- poll: consume, claim, launch ------------------------------------------------------

    async def _poll_loop(self) -> None:
        while not self._stopping:
            await self.poll_once()

    async def poll_once(self) -> PollResult:
        """Take up to the free slots' worth of messages, claim them in one CAS, start their handlers."""
        free = self.config.concurrency - len(self._running)
        if free <= 0:
            self._slot_freed.clear()
            try:
                await asyncio.wait_for(self._slot_freed.wait(), self.config.poll_timeout_sec)
            except TimeoutError:
                await self.consumer.keepalive(0)
            return PollResult()
        # One pass at a time: a second pass in flight (to overlap the CAS with consuming) measured no
        # faster, because consume calls share the consumer's one thread and an idle one blocks it.
        deliveries = await self.consumer.poll(min(free, self.config.poll_batch), self.config.poll_timeout_sec)
        if not deliveries:
            return PollResult()
        self.stats.consumed += len(deliveries)
        return await self._admit(deliveries)

    async def _admit(self, deliveries: Sequence[Delivery]) -> PollResult:
        claims: dict[tuple[UUID, int], _Claim] = {}
        duplicates = 0
        for delivery in deliveries:
            message = self._decode(delivery)
            if message is None:
                continue
            execution_id = UUID(message.execution_id)
            unsettled = self._unsettled.get(execution_id)
            if unsettled is not None and unsettled.attempt == message.attempt:
                # Redelivered before its outcome is written (a rebalance handed the partition back):
                # the CAS would lose and acknowledge it at once, letting the commit pass a message
                # whose write is not done. Its offset is acknowledged with the outcome instead.
                unsettled.deliveries.append(delivery)
                duplicates += 1
                continue
            claim = claims.get((execution_id, message.attempt))
            if claim is None:
                claims[(execution_id, message.attempt)] = _Claim(message, execution_id, [delivery])
            else:
                claim.deliveries.append(delivery)  # counted as a duplicate once the CAS has decided
        if not claims or self._stopping:
            # Stopping: leave these unacknowledged; their offsets stay uncommitted and another member
            # (or this one, restarted) gets them again.
            self.stats.duplicates += duplicates
            return PollResult(consumed=len(deliveries), duplicates=duplicates)
        rows = await self._with_db_retry(
            "start executions",
            lambda stores: stores.executions.start_executions(
                self.worker_id, list(claims), [c.deliveries[0].published_at for c in claims.values()]
            ),
        )
        if rows is None:  # stopping while the database was unreachable
            return PollResult(consumed=len(deliveries), duplicates=duplicates)
        won: dict[UUID, Record] = {UUID(str(row["id"])): row for row in rows}
        started: list[UUID] = []
        for (execution_id, attempt), claim in claims.items():
            row = won.get(execution_id)
            if row is None or row["attempt"] != attempt:
                duplicates += len(claim.deliveries)
                log.debug(
                    "not starting %s attempt %d: lost the start CAS (duplicate or stale delivery)",
                    execution_id,
                    attempt,
                    extra={"execution_id": str(execution_id), "attempt": attempt},
                )
                self._ack(claim.deliveries)
                continue
            # Every delivery beyond the first of one execution is a duplicate that does not run.
            duplicates += len(claim.deliveries) - 1
            self._launch(claim, row)
            started.append(execution_id)
        self.stats.duplicates += duplicates
        self.stats.started += len(started)
        # Liveness keys go out after the handlers have started, so the Redis round trip overlaps them.
        await self._renew_heartbeats(started)
        return PollResult(consumed=len(deliveries), started=len(started), duplicates=duplicates)

    def _decode(self, delivery: Delivery) -> ExecutionMessage | None:
        try:
            if delivery.value is None:
                raise ValueError("empty message")
            message = ExecutionMessage.decode(delivery.value)
            UUID(message.execution_id)
            return message
        except (ValueError, TypeError, orjson.JSONDecodeError) as exc:
            # Nothing can ever run it, and it must not block the partition's commits: skip it loudly.
            log.error(
                "skipping undecodable message %s[%d]@%d: %s", delivery.topic, delivery.partition, delivery.offset, exc
            )
            self.stats.undecodable += 1
            self._ack([delivery])
            return None

    def _launch(self, claim: _Claim, row: Record) -> None:
        message = claim.message
        running = _Running(claim.execution_id, message.attempt, message, claim.deliveries)
        self._running[claim.execution_id] = running
        self._unsettled[claim.execution_id] = running
        task = asyncio.create_task(self._execute(running, row), name=f"handler {message.handler} {claim.execution_id}")
        running.task = task
        task.add_done_callback(self._on_handler_done)

    def _on_handler_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        if (exc := task.exception()) is not None:
            # _execute turns every handler error into an outcome; an exception here is our bug.
            self._fail(f"handler task {task.get_name()}", exc)

    # --- running a handler -----------------------------------------------------------------

    async def _execute(self, running: _Running, row: Record) -> None:
        message = running.message
        delivery = running.deliveries[0]
        spec = self.worker.registry.get(message.handler)
        try:
            with tracer.start_as_current_span(
                f"handler {message.handler}",
                context=context_from(delivery.traceparent or message.traceparent),
                kind=SpanKind.CONSUMER,
                attributes={
                    "messaging.system": "kafka",
                    "messaging.destination.name": delivery.topic,
                    "messaging.kafka.destination.partition": delivery.partition,
                    "messaging.kafka.message.offset": delivery.offset,
                    "sundial.execution_id": message.execution_id,
                    "sundial.job_id": message.job_id,
                    "sundial.tenant": message.tenant_id,
                    "sundial.attempt": message.attempt,
                    "sundial.fence_token": message.fence_token,
                    "sundial.pool": self.worker.pool,
                    "sundial.handler": message.handler,
                    "sundial.worker_id": self.worker_id,
                },
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
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
                    previous_progress=row.get("previous_progress"),
                    _sink=self,
                )
                running.ctx = ctx
                if running.cancel.is_set():  # asked to stop before it even started
                    ctx.request_cancel()
                try:
                    outcome = await self._invoke(spec, ctx, message, span, running)
                except asyncio.CancelledError:
                    span.set_attribute("sundial.outcome", "ABANDONED")
                    raise
                if outcome.state in ("FAILED", "TIMED_OUT"):
                    # The backoff is the worker's to compute (the policy's jitter); Postgres decides whether
                    # attempts are left and adds it to its own clock.
                    policy = RetryPolicy.from_json(row.get("retry_policy"))
                    outcome = dataclasses.replace(outcome, retry_delay_ms=policy.delay_ms(running.attempt))
                span.set_attribute("sundial.outcome", outcome.state)
        finally:
            # The slot frees when the handler ends; the outcome's write and commit follow in batches.
            self._running.pop(running.execution_id, None)
            self._slot_freed.set()
        self._finished.append(_Finished(outcome, running.deliveries, logger))
        self._finished_ready.set()
        if len(self._finished) >= self.config.flush_max_outcomes:
            self._flush_full.set()

    async def _invoke(
        self, spec: HandlerSpec | None, ctx: Context, message: ExecutionMessage, span: Span, running: _Running
    ) -> Outcome:
        def outcome(state: str, result: Any = None, error: str | None = None) -> Outcome:
            return Outcome(ctx.execution_id, ctx.attempt, state, result, error)

        if spec is None:
            error = self.worker.registry.unknown_handler_error(message.handler)
            ctx.logger.error("%s", error)
            span.set_status(Status(StatusCode.ERROR, error))
            self.stats.failed += 1
            return outcome("FAILED", error=error)
        timeout = message.timeout_sec if message.timeout_sec and message.timeout_sec > 0 else None
        ctx.logger.debug("running handler %s", spec.name)
        # The handler runs as a task of its own, so that a timeout or a cancel can interrupt it and still
        # give it the cancel grace to clean up, while this task decides the outcome.
        work = self._start_handler(spec, ctx, message.payload)
        try:
            interrupted = await self._wait_handler(work, running.cancel, timeout)
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
        encoded, problem = _encode_result(result)
        if problem is not None:
            ctx.logger.error("%s", problem)
            span.set_status(Status(StatusCode.ERROR, problem))
            self.stats.failed += 1
            return outcome("FAILED", error=problem)
        self.stats.succeeded += 1
        return outcome("SUCCEEDED", result=encoded)

    def _start_handler(self, spec: HandlerSpec, ctx: Context, payload: Any) -> asyncio.Future[Any]:
        if spec.is_async:
            return asyncio.ensure_future(spec.func(ctx, payload))
        return self._submit_sync(spec, ctx, payload)

    @staticmethod
    async def _wait_handler(work: asyncio.Future[Any], cancel: asyncio.Event, limit_sec: float | None) -> str | None:
        """Wait for the handler to end; None if it did, else why it must be interrupted (timeout, cancel)."""
        if cancel.is_set():
            return "cancel"
        cancelled = asyncio.ensure_future(cancel.wait())
        try:
            # asyncio.wait, not asyncio.timeout: reaching the limit must not cancel anything yet.
            await asyncio.wait([work, cancelled], timeout=limit_sec, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancelled.cancel()
        if work.done():
            return None
        return "cancel" if cancel.is_set() else "timeout"

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
            self.stats.abandoned_on_interrupt += 1
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
            self.stats.timed_out += 1
            return outcome("TIMED_OUT", error=error)
        error = "Cancelled: the execution's cancel was requested"
        ctx.logger.info("handler %s cancelled on request", spec.name)
        self.stats.cancelled += 1
        return outcome("CANCELLED", error=error)

    def _handler_failed(self, ctx: Context, span: Span, exc: BaseException, outcome: Callable[..., Outcome]) -> Outcome:
        error = _error_text(exc)
        # The traceback stays in the log (and on the span); Postgres keeps the one-line error.
        ctx.logger.warning("handler %s failed: %s", ctx.handler, error, exc_info=exc)
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, error))
        self.stats.failed += 1
        return outcome("FAILED", error=error)

    def _submit_sync(self, spec: HandlerSpec, ctx: Context, payload: Any) -> asyncio.Future[Any]:
        assert self._handler_threads is not None
        # Copy the context so the handler's thread sees the handler span as current.
        future = self._handler_threads.submit(contextvars.copy_context().run, spec.func, ctx, payload)
        # A thread cannot be interrupted: after a timeout or a shutdown cancel it runs on, and the
        # process must know (see stuck_sync_handlers) rather than hang at exit waiting for it.
        self._sync_calls.add(future)
        future.add_done_callback(self._sync_calls.discard)
        return asyncio.wrap_future(future)

    # --- heartbeats and progress -------------------------------------------------------------

    async def heartbeat(self, ctx: Context, progress: Any | None) -> None:
        """``ctx.heartbeat``: renew this execution's liveness key; store progress on the attempt."""
        if self._redis is not None:
            try:
                await self._redis.set(
                    heartbeat_key(ctx.execution_id), self.worker_id, px=int(self.config.heartbeat_ttl_sec * 1000)
                )
            except _REDIS_ERRORS as exc:
                ctx.logger.warning("heartbeat to Redis failed: %s", exc)
        if progress is None:
            return
        encoded, problem = _encode_result(progress)
        if problem is not None:
            raise TypeError(problem.replace("handler result", "progress"))
        try:
            accepted = await self.stores.executions.record_progress(
                ctx.execution_id, ctx.attempt, self.worker_id, encoded
            )
        except _TRANSIENT_DB_ERRORS as exc:
            ctx.logger.warning("could not store progress: %s", exc)
            return
        if not accepted:
            ctx.logger.warning("progress write rejected: this attempt is no longer RUNNING on this worker")

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_interval_sec)
            await self.heartbeat_once()
            await self.cancel_requests_from_postgres()

    # --- cancellation -------------------------------------------------------------------------

    async def _cancel_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.cancel_poll_interval_sec)
            await self.cancel_once()

    async def cancel_once(self) -> int:
        """Read the Redis cancel flags of every running execution in one call; interrupt those flagged."""
        redis = self._redis
        ids = [r.execution_id for r in self._running.values() if not r.cancel.is_set()]
        if not ids or redis is None:
            return 0
        try:
            flags: list[Any] = []
            for i in range(0, len(ids), _RENEW_CHUNK):
                flags += await redis.mget([cancel_key(e) for e in ids[i : i + _RENEW_CHUNK]])
        except _REDIS_ERRORS as exc:
            # Postgres keeps the request too; the heartbeat pass reads it from there.
            log.warning("reading cancel flags failed: %s", exc)
            return 0
        return self._request_cancel([e for e, flag in zip(ids, flags, strict=True) if flag is not None])

    async def cancel_requests_from_postgres(self) -> int:
        """The fallback for a lost Redis flag (Redis flushed or restarted): ``executions.cancel_requested_at``."""
        ids = [r.execution_id for r in self._running.values() if not r.cancel.is_set()]
        if not ids or self._stores is None:
            return 0
        try:
            requested = await self.stores.executions.cancel_requested(ids)
        except _TRANSIENT_DB_ERRORS as exc:
            log.warning("reading cancel requests from Postgres failed: %s", exc)
            return 0
        return self._request_cancel([e for e in ids if e in requested])

    def _request_cancel(self, execution_ids: Sequence[UUID]) -> int:
        for execution_id in execution_ids:
            running = self._running.get(execution_id)
            if running is None or running.cancel.is_set():
                continue
            if running.ctx is not None:
                running.ctx.request_cancel()
                running.ctx.logger.info("cancel requested: interrupting the handler")
            running.cancel.set()
        return len(execution_ids)

    async def heartbeat_once(self) -> int:
        """Renew every running execution's liveness key in one Redis call; returns how many."""
        return await self._renew_heartbeats(list(self._running))

    async def _renew_heartbeats(self, execution_ids: Sequence[UUID]) -> int:
        renew = self._renew_script
        if not execution_ids or renew is None:
            return 0
        ttl_ms = int(self.config.heartbeat_ttl_sec * 1000)
        keys = [heartbeat_key(e) for e in execution_ids]
        try:
            for i in range(0, len(keys), _RENEW_CHUNK):
                await renew(keys=keys[i : i + _RENEW_CHUNK], args=[self.worker_id, ttl_ms])
        except _REDIS_ERRORS as exc:
            # Not fatal: Postgres holds the truth; a missed renewal at worst lets the sweeper retry.
            log.warning("heartbeat renewal of %d executions failed: %s", len(execution_ids), exc)
            return 0
        return len(execution_ids)

    async def _drop_heartbeats(self, execution_ids: Sequence[UUID]) -> None:
        release = self._release_script
        if not execution_ids or release is None:
            return
        keys = [heartbeat_key(e) for e in execution_ids]
        try:
            for i in range(0, len(keys), _RENEW_CHUNK):
                await release(keys=keys[i : i + _RENEW_CHUNK], args=[self.worker_id])
        except _REDIS_ERRORS as exc:
            log.warning("could not delete %d heartbeat keys (they expire anyway): %s", len(execution_ids), exc)

    # --- flush: batched outcome writes ------------------------------------------------------

    async def _flush_loop(self) -> None:
        backoff = 0.05
        while True:
            if not self._finished:
                if self._draining:
                    return
                self._finished_ready.clear()
                await self._finished_ready.wait()
                continue
            if len(self._finished) < self.config.flush_max_outcomes and not self._draining:
                # Give the first outcome a few milliseconds of company: one write for many.
                self._flush_full.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._flush_full.wait(), self.config.flush_interval_sec)
            try:
                await self.flush_once()
                backoff = 0.05
            except _TRANSIENT_DB_ERRORS as exc:
                log.error("writing %d outcomes failed, retrying in %.2fs: %s", len(self._finished), backoff, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX_SEC)

    async def flush_once(self) -> FlushResult:
        """Write up to ``flush_max_outcomes`` finished outcomes in one statement, then acknowledge them."""
        if not self._finished:
            return FlushResult()
        batch = self._finished[: self.config.flush_max_outcomes]
        written = await self.stores.executions.finish_attempts(self.worker_id, [f.outcome for f in batch])
        # Only now is the batch out of the buffer: a failed write above leaves it to be retried.
        del self._finished[: len(batch)]
        accepted = {f.execution_id: f for f in written}
        rejected = 0
        for finished in batch:
            if (record := accepted.get(finished.outcome.execution_id)) is not None:
                if record.next_attempt_at is not None:
                    self.stats.retries_scheduled += 1
                    finished.logger.info(
                        "attempt %d %s; next attempt at %s",
                        record.attempt,
                        record.attempt_state,
                        record.next_attempt_at.isoformat(),
                    )
                elif record.state == "DEAD":
                    self.stats.dead += 1
                    finished.logger.warning(
                        "attempt %d %s; no attempts left: DEAD", record.attempt, record.attempt_state
                    )
            if finished.outcome.execution_id not in accepted:
                rejected += 1
                finished.logger.warning(
                    "late write rejected: %s was not recorded, another actor changed the execution first",
                    finished.outcome.state,
                )
            else:
                finished.logger.debug("execution finished: %s", finished.outcome.state)
            self._unsettled.pop(finished.outcome.execution_id, None)
            self._ack(finished.deliveries)
        self.stats.flushes += 1
        self.stats.rejected += rejected
        await self._drop_heartbeats([f.outcome.execution_id for f in batch])
        await self._schedule_retries(written)
        return FlushResult(written=len(batch) - rejected, rejected=rejected)

    async def _schedule_retries(self, written: Sequence[Finished]) -> None:
        """Put the retries just scheduled into their shards' hot windows, if they are due within it.

        Best effort: Postgres has the retry, and the hydrator promotes it (or re-adds it once overdue).
        """
        window = self._hot_window
        if window is None:
            return
        horizon = datetime.now(UTC) + timedelta(seconds=self.settings.hot_window_sec) + _HOT_WINDOW_MARGIN
        by_shard: dict[int, list[RetryDue]] = {}
        for record in written:
            retry = record.retry
            if retry is not None and retry.due < horizon:
                by_shard.setdefault(record.shard, []).append(retry)
        try:
            for shard, retries in by_shard.items():
                await window.add_retries(shard, retries)
        except _REDIS_ERRORS as exc:
            log.warning("could not add %d retries to the hot window (the hydrator will): %s", len(written), exc)

    # --- commit -------------------------------------------------------------------------------

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.commit_interval_sec)
            await self.commit_once()

    async def commit_once(self) -> int:
        """Commit each partition's acknowledged prefix; returns how many partitions moved."""
        moved = await self.consumer.commit()
        if moved:
            self.stats.commits += 1
        return moved

    def _ack(self, deliveries: Sequence[Delivery]) -> None:
        for delivery in deliveries:
            self.consumer.ack(delivery)

    # --- shutdown steps ---------------------------------------------------------------------

    async def _stop_polling(self) -> None:
        # The poll loop is not cancelled: cancelling it between the start CAS and launching the
        # handlers would strand RUNNING rows. It checks the flag at least every poll timeout.
        self._slot_freed.set()
        task = self._side_tasks.get("poll")
        if task is not None and not task.done():
            await asyncio.wait([task])

    async def _finish_handlers(self) -> None:
        tasks = [r.task for r in self._running.values() if r.task is not None]
        if not tasks:
            return
        log.info("waiting up to %.1fs for %d running handlers", self.config.shutdown_grace_sec, len(tasks))
        # "All handlers done, or forced": asyncio.wait(tasks) as one future (waiting on it never
        # cancels the handlers themselves), raced against the force event, bounded by the grace.
        all_done = asyncio.ensure_future(asyncio.wait(tasks))
        forced = asyncio.ensure_future(self._force.wait())
        try:
            await asyncio.wait(
                [all_done, forced], timeout=self.config.shutdown_grace_sec, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            all_done.cancel()
            forced.cancel()
        left = [t for t in tasks if not t.done()]
        if not left:
            return
        abandoned = [r for r in self._running.values() if r.task in left]
        for running in abandoned:
            logger = running.ctx.logger if running.ctx else log
            logger.warning("abandoning handler after the shutdown grace; the execution stays RUNNING for the sweeper")
        self.stats.abandoned += len(abandoned)
        ids = [r.execution_id for r in abandoned]
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        # Their liveness keys go now, so the sweeper can take these executions over without waiting
        # out the TTL; their offsets were never acknowledged, so Kafka redelivers them too.
        await self._drop_heartbeats(ids)

    async def _drain_outcomes(self) -> None:
        task = self._side_tasks.get("flush")
        self._draining = True
        self._finished_ready.set()
        self._flush_full.set()
        if task is None or task.done():
            return
        done, _ = await asyncio.wait([task], timeout=_FINAL_FLUSH_SEC)
        if not done:
            log.error(
                "could not write %d outcomes within %.0fs; those executions stay RUNNING for the sweeper",
                len(self._finished),
                _FINAL_FLUSH_SEC,
            )
            await self._cancel_side_task("flush")

    async def _cancel_side_task(self, name: str) -> None:
        task = self._side_tasks.get(name)
        if task is None or task.done():
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _close_resources(self) -> None:
        try:
            await self.consumer.close()
        except Exception:
            log.exception("closing the Kafka consumer failed")
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None
            self._renew_script = None
            self._release_script = None
            self._hot_window = None
        if self._stores is not None:
            await self._stores.close()
            self._stores = None
        if self._handler_threads is not None:
            # Don't wait: an abandoned sync handler may never return.
            self._handler_threads.shutdown(wait=False, cancel_futures=True)
            self._handler_threads = None

    # --- supervision ------------------------------------------------------------------------

    def _spawn(self, name: str, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        task = asyncio.create_task(loop(), name=f"sundial-worker-{name}")
        self._side_tasks[name] = task
        task.add_done_callback(lambda t: self._on_side_task_done(name, t))

    def _on_side_task_done(self, name: str, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            if not self._stopping:
                self._fail(f"side task {name}", RuntimeError(f"side task {name} was cancelled"))
            return
        exc = task.exception()
        if exc is not None:
            self._fail(f"side task {name}", exc)
        elif not self._stopping:
            self._fail(f"side task {name}", RuntimeError(f"side task {name} returned unexpectedly"))

    def _fail(self, what: str, exc: BaseException) -> None:
        log.critical("%s died; the worker is shutting down", what, exc_info=exc)
        if self._failure is None:
            self._failure = exc
        self._crashed.set()

    async def _with_db_retry(
        self, what: str, call: Callable[[Stores], Coroutine[Any, Any, list[Record]]]
    ) -> list[Record] | None:
        backoff = 0.05
        while True:
            try:
                return await call(self.stores)
            except _TRANSIENT_DB_ERRORS as exc:
                if self._stopping:
                    log.error("%s failed while stopping; giving up: %s", what, exc)
                    return None
                log.error("%s failed, retrying in %.2fs: %s", what, backoff, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX_SEC)


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\x00", "\\0")
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 1] + "…"


def _encode_result(value: Any) -> tuple[Any, str | None]:
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
