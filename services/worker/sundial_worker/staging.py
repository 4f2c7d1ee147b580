"""Staging pools: a worker serving one runs replayed messages with ``ctx.replay`` and records them in ``replay_runs``.

A pool registered with kind ``staging`` (:mod:`sundial_common.stores.pools`) is fed only by replays
(``POST /v1/replays``): its messages are production messages re-published with ``sundial-replay-*`` headers.
They are not executions of this pool. So :class:`StagingRuntime` runs them without any of the production
path — no PENDING→RUNNING compare-and-swap, no attempt, heartbeat, retry or audit row: it runs the same
handler the production pool registered, with :attr:`~sundial_worker.sdk.Context.replay` set and
``ctx.execution_id`` the original execution's id, and records the outcome (SUCCEEDED, FAILED or TIMED_OUT
after the message's ``timeout_sec``), error and duration in ``replay_runs`` (one batch per poll).

Delivery is at least once: a poll's offsets are committed after its runs are written, and a message seen
again (a resumed replay re-publishes its last batch; a staging worker restarted before its commit) adds a
delivery to its row instead of a second row. The consumer group is the staging pool's own, never the
production pool's. A message without replay headers (someone published into the staging topic by hand) is
skipped with a warning. A message of a tenant the staging pool does not admit is not run either (recorded
FAILED with the reason, :mod:`~sundial_worker.pool_guard`). :class:`ServingRuntime` is the worker CLI's
runtime: it reads the pool's kind from the registry when it starts and serves it with this runtime or the
production one (a kind changed later applies at the worker's next start).
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar
from uuid import UUID

import asyncpg
from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from redis.asyncio import Redis
from sundial_common.broker.kafka import NO_METRICS_PUSH, ensure_topics
from sundial_common.broker.messages import ExecutionMessage, pool_topic
from sundial_common.broker.topic_windows import replay_headers_of
from sundial_common.hotwindow.worker_announcements import WorkerAnnouncements
from sundial_common.runtime.settings import CommonSettings
from sundial_common.security.encryption import PAYLOAD, TenantCipher, open_keyring
from sundial_common.stores import Stores
from sundial_common.stores.pool_cache import PoolCache
from sundial_common.stores.replays import ReplayRun

from sundial_worker.announcer import Announcer
from sundial_worker.consumer import consumer_group
from sundial_worker.errors import TRANSIENT_DB_ERRORS, StartupError
from sundial_worker.pool_guard import PoolGuard
from sundial_worker.runtime import WorkerConfig, WorkerRuntime
from sundial_worker.sdk import Context, ReplayInfo, Worker, context_logger

log = logging.getLogger("sundial.worker.staging")
handler_log = logging.getLogger("sundial.handler")

T = TypeVar("T")
_ERROR_LIMIT = 4000


class ServingRuntime:
    """Serves ``worker``'s pool with the staging runtime if the registry says it is a staging pool, else with the
    production one (an unregistered pool too: its guard refuses every message until it is registered)."""

    def __init__(self, worker: Worker, settings: CommonSettings, *, config: WorkerConfig, worker_id: str) -> None:
        self.worker = worker
        self.settings = settings
        self.config = config
        self.worker_id = worker_id
        self.runtime: WorkerRuntime | StagingRuntime | None = None
        self._force = False

    async def run_until(self, stop: asyncio.Event) -> None:
        try:
            stores = await Stores.connect(self.settings.database_url, min_size=1, max_size=1)
        except (*TRANSIENT_DB_ERRORS, asyncpg.PostgresError) as exc:
            where = self.settings.database_url.rpartition("@")[2]  # never the password
            raise StartupError(
                f"cannot reach Postgres at {where} (SUNDIAL_DATABASE_URL): {exc}. Is the stack running (`make up` "
                "in the checkout)? Elsewhere, set SUNDIAL_DATABASE_URL, SUNDIAL_REDIS_URL and SUNDIAL_KAFKA_BOOTSTRAP"
            ) from exc
        try:
            entry = await stores.pools.get_pool(self.worker.pool)
        finally:
            await stores.close()
        kind = WorkerRuntime if entry is None or not entry.staging else StagingRuntime
        self.runtime = kind(self.worker, self.settings, config=self.config, worker_id=self.worker_id)
        if self._force:
            self.runtime.force_stop()
        await self.runtime.run_until(stop)

    def force_stop(self) -> None:
        self._force = True
        if self.runtime is not None:
            self.runtime.force_stop()

    @property
    def stuck_sync_handlers(self) -> int:
        return 0 if self.runtime is None else self.runtime.stuck_sync_handlers


class _Slots(asyncio.Semaphore):
    """The handler slots, counting those taken (the announcement's free slots)."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.taken = 0

    async def acquire(self) -> Literal[True]:
        acquired = await super().acquire()
        self.taken += 1
        return acquired

    def release(self) -> None:
        self.taken -= 1
        super().release()


@dataclass(frozen=True, slots=True)
class _Replayed:
    """One polled message of a replay, decoded."""

    partition: int
    offset: int
    message: ExecutionMessage
    replay: ReplayInfo


class StagingRuntime:
    """Runs a staging pool's replayed messages and records them per replay. Start/stop via :meth:`run_until`."""

    def __init__(self, worker: Worker, settings: CommonSettings, *, config: WorkerConfig, worker_id: str) -> None:
        self.worker = worker
        self.settings = settings
        self.config = config
        self.worker_id = worker_id
        self.topic = pool_topic(worker.pool)
        self.ready = asyncio.Event()
        self.runs = 0
        self._force = asyncio.Event()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sundial-staging-{worker.pool}")
        self._consumer: Consumer | None = None
        self._stuck = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def stuck_sync_handlers(self) -> int:
        return self._stuck

    def force_stop(self) -> None:
        self._force.set()

    async def _call(self, func: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, func, *args)

    def _open(self) -> None:
        ensure_topics(self.settings.kafka_bootstrap, [self.topic])
        consumer = Consumer(
            {
                "bootstrap.servers": self.settings.kafka_bootstrap,
                "group.id": consumer_group(self.worker.pool),
                "client.id": self.worker_id,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 1000,
                # A staging pool takes replays, not due work: 1 s fetch waits cost the broker ~0.002 of a core per
                # idle consumer where 250 ms cost ~0.004 and 10 ms ~0.04 (measured on Tansu); a
                # replayed message arrives ~130 ms after its produce at the median (~28 ms at 250, ~3 ms at 10).
                "fetch.wait.max.ms": 1000,
                **NO_METRICS_PUSH,
            }
        )
        loop = self._loop  # this runs on the consumer thread: the loop was noted in run_until

        def assigned(_consumer: Consumer, _partitions: list[Any]) -> None:
            if loop is not None:
                loop.call_soon_threadsafe(self.ready.set)

        consumer.subscribe([self.topic], on_assign=assigned)
        self._consumer = consumer

    def _poll(self, max_messages: int, timeout: float) -> list[Message]:
        assert self._consumer is not None
        messages = self._consumer.consume(1, timeout)
        if messages and max_messages > 1:
            messages.extend(self._consumer.consume(max_messages - 1, 0))
        usable = []
        for message in messages:
            err = message.error()
            if err is None:
                usable.append(message)
            elif err.fatal():
                raise KafkaException(err)
            elif err.code() != KafkaError._PARTITION_EOF:
                log.warning("kafka consume error on %s: %s", self.topic, err)
        return usable

    def _commit(self) -> None:
        assert self._consumer is not None
        try:
            self._consumer.commit(asynchronous=False)
        except KafkaException as exc:  # nothing consumed since the last commit, or a rebalance: next time
            if exc.args[0].code() != KafkaError._NO_OFFSET:
                log.warning("staging offset commit failed: %s", exc)

    def _close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    async def run_until(self, stop: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        stores = await Stores.connect(self.settings.database_url, min_size=1, max_size=self.config.db_pool_size)
        try:
            keyring = await open_keyring(self.settings, stores.keys)  # a wrong or missing master key stops here
        except BaseException:
            await stores.close()
            raise
        log.info(
            "staging worker %s serving %s (replays only): handlers %s",
            self.worker_id,
            self.worker.pool,
            ", ".join(self.worker.registry.names()) or "none",
        )
        slots = _Slots(self.config.concurrency)
        guard = PoolGuard(PoolCache(stores.pools, self.config.pool_cache_sec, recheck_sec=1.0), self.worker.pool)
        # Announced like a production worker (its pool's view lists it, with its handlers and free slots), once
        # its consumer has joined the staging group.
        redis = Redis.from_url(self.settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
        announcer = Announcer(
            WorkerAnnouncements(redis), self.worker, self.worker_id, self.config.announce(), busy=lambda: slots.taken
        )
        announcing = asyncio.create_task(self._announce(announcer), name=f"sundial-staging-announce-{self.worker_id}")
        try:
            await self._call(self._open)
            while not stop.is_set():
                polled = await self._call(self._poll, self.config.poll_batch, self.config.poll_timeout_sec)
                if not polled:
                    continue
                replayed = [r for r in map(self._decode, polled) if r is not None]
                # Replayed payloads are sealed as the originals were: the batch's tenants' keys, one read
                # for tenants this process has not seen yet.
                ciphers = await keyring.ciphers({r.message.tenant_id for r in replayed})
                entry = await guard.entry()
                if any(not guard.admits(entry, r.message.tenant_id, r.message.tenant_id) for r in replayed):
                    entry = await guard.fresh_entry()
                batch: asyncio.Future[list[ReplayRun]] = asyncio.ensure_future(
                    asyncio.gather(
                        *(
                            self._run(
                                r,
                                slots,
                                ciphers[r.message.tenant_id],
                                guard.refusal(entry, r.message.tenant_id, r.message.tenant_id),
                            )
                            for r in replayed
                        )
                    )
                )
                forced: asyncio.Future[Any] = asyncio.ensure_future(self._force.wait())
                await asyncio.wait([batch, forced], return_when=asyncio.FIRST_COMPLETED)
                forced.cancel()
                if not batch.done():  # a second signal: abandon the batch unrecorded; Kafka delivers it again
                    batch.cancel()
                    log.warning("abandoning %d running replayed messages", len(replayed))
                    return
                runs = batch.result()
                await stores.replays.record_runs(runs)
                self.runs += len(runs)
                await self._call(self._commit)
        finally:
            announcing.cancel()
            await asyncio.wait([announcing])  # no renewal lands after the withdrawal
            await announcer.withdraw()
            await redis.aclose()
            try:
                await self._call(self._close)
            finally:
                self._thread.shutdown(wait=False)
                await stores.close()
            log.info("staging worker %s stopped after %d runs", self.worker_id, self.runs)

    async def _announce(self, announcer: Announcer) -> None:
        await self.ready.wait()
        await announcer.run_once()
        await announcer.run()

    def _decode(self, message: Message) -> _Replayed | None:
        headers = replay_headers_of(message.headers())  # type: ignore[arg-type]
        partition, offset, value = message.partition(), message.offset(), message.value()
        try:
            assert value is not None and partition is not None and offset is not None
            body = ExecutionMessage.decode(value)
            info = ReplayInfo(
                replay_id=UUID(headers["id"]),
                original_execution_id=UUID(headers["execution-id"]),
                source_topic=headers["topic"],
                source_partition=int(headers["partition"]),
                source_offset=int(headers["offset"]),
                published_at=datetime.fromtimestamp(int(headers["timestamp"]) / 1000, UTC),
            )
        except (AssertionError, KeyError, ValueError, TypeError) as exc:
            log.warning("skipping %s[%s]@%s: not a replayed message (%r)", self.topic, partition, offset, exc)
            return None
        return _Replayed(partition, offset, body, info)

    async def _run(
        self, item: _Replayed, slots: asyncio.Semaphore, cipher: TenantCipher, refusal: str | None
    ) -> ReplayRun:
        message, info = item.message, item.replay
        spec = self.worker.registry.get(message.handler)
        outcome, error = "SUCCEEDED", None
        async with slots:
            started = time.perf_counter()
            if refusal is not None:
                outcome, error = "FAILED", refusal
                log.warning(
                    "%s: replayed message of execution %s not run",
                    refusal,
                    info.original_execution_id,
                    extra={"tenant": message.tenant_id, "execution_id": str(info.original_execution_id)},
                )
            elif spec is None:
                outcome, error = "FAILED", self.worker.registry.unknown_handler_error(message.handler)
            else:
                ctx = Context(
                    execution_id=info.original_execution_id,
                    job_id=UUID(message.job_id),
                    tenant=message.tenant_id,
                    attempt=message.attempt,
                    fence_token=message.fence_token,
                    scheduled_for=datetime.fromisoformat(message.scheduled_for),
                    handler=message.handler,
                    pool=self.worker.pool,
                    trace_id=None,
                    logger=context_logger(
                        handler_log,
                        tenant=message.tenant_id,
                        job_id=UUID(message.job_id),
                        execution_id=info.original_execution_id,
                        attempt=message.attempt,
                        trace_id=None,
                    ),
                    replay=info,
                )
                try:
                    payload = cipher.open_json(message.payload, PAYLOAD)
                    call: Any = spec.func(ctx, payload) if spec.is_async else asyncio.to_thread(spec.func, ctx, payload)
                    await asyncio.wait_for(call, message.timeout_sec)
                except TimeoutError:
                    ctx.request_cancel()
                    outcome, error = "TIMED_OUT", f"the handler ran past timeoutSec ({message.timeout_sec}s)"
                    if not spec.is_async:
                        self._stuck += 1
                except Exception as exc:  # the handler's failure is the run's outcome
                    outcome = "FAILED"
                    error = "".join(traceback.format_exception_only(exc)).strip()[:_ERROR_LIMIT]
        return ReplayRun(
            replay_id=info.replay_id,
            source_partition=info.source_partition,
            source_offset=info.source_offset,
            original_execution_id=info.original_execution_id,
            handler=message.handler,
            outcome=outcome,
            # Kept readable: a run has no tenant column for the API to open it with (an admin replay spans
            # tenants); see docs/operations/security.md.
            error=error,
            duration_ms=(time.perf_counter() - started) * 1000,
            worker_id=self.worker_id,
        )
