"""The worker runtime: composes and supervises the loops that serve one pool.

Kafka → start CAS → handler → batched outcome write → offset commit. One :class:`WorkerRuntime` serves
one :class:`~sundial_worker.sdk.Worker` (one pool). It owns the connections (Postgres, Redis, the Kafka
consumer) and the start/stop contract, and builds its parts from one :class:`WorkerConfig`:

- :mod:`~sundial_worker.admission` (task ``poll``): consume, claim a batch with one start CAS, launch — only
  the executions of tenants the pool admits (:mod:`~sundial_worker.pool_guard`);
- :mod:`~sundial_worker.execution`: a task per handler, its timeout and cancel, its outcome;
- :mod:`~sundial_worker.heartbeats` (thread ``sundial-liveness``, tasks ``heartbeat`` and ``cancel``): liveness
  keys, renewed from a thread a handler cannot block, ``ctx.heartbeat``, cancel requests from Redis and, as the
  fallback, Postgres;
- :mod:`~sundial_worker.outcomes` (task ``flush``): batched outcome writes, retries into the hot window;
- :mod:`~sundial_worker.commits` (task ``commit``): the acknowledged offset prefix to Kafka;
- :mod:`~sundial_worker.announcer` (task ``announce``): this worker in its pool's live workers (handlers, free
  slots), from the moment it has joined the consumer group until it stops taking work;
- :mod:`~sundial_worker.inflight`: what they share (executions in flight, the outcome buffer, the counters).

So the only per-message round trip is the handler itself: starts, finishes and heartbeats travel in
batches. Each side task is named ``sundial-worker-<loop>``; one that dies (or returns, or is cancelled
before a stop) fails the whole runtime loudly — :meth:`WorkerRuntime.run_until` raises
:class:`~sundial_worker.errors.WorkerCrashed` (:mod:`~sundial_worker.supervision`).

Start: take this worker's next incarnation and declare what an earlier one left RUNNING lost
(:mod:`~sundial_worker.incarnations`), then join the pool's consumer group.

Shutdown (SIGTERM/SIGINT in the CLI): stop taking messages, let running handlers finish for up to
``shutdown_grace_sec``, then cancel the rest — they stay RUNNING in Postgres and their offsets stay
uncommitted, so the sweeper (or the next member of the group) takes them over — then flush the
outcomes, commit, and leave the consumer group.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, fields
from types import TracebackType

import asyncpg
from redis import Redis as SyncRedis
from redis.asyncio import Redis
from sundial_common.broker.messages import pool_topic
from sundial_common.hotwindow.window import HotWindow
from sundial_common.hotwindow.worker_announcements import WorkerAnnouncements
from sundial_common.runtime.settings import CommonSettings
from sundial_common.security.encryption import Keyring, open_keyring
from sundial_common.stores import Stores
from sundial_common.stores.pool_cache import PoolCache

from sundial_worker.admission import Admission, AdmissionConfig
from sundial_worker.announcer import AnnounceConfig, Announcer
from sundial_worker.commits import CommitConfig, OffsetCommitter
from sundial_worker.consumer import ExecutionConsumer, KafkaExecutionConsumer
from sundial_worker.errors import WorkerCrashed, check_positive_int, check_seconds
from sundial_worker.execution import ExecutionConfig, HandlerExecutor
from sundial_worker.heartbeats import CancelWatch, CancelWatchConfig, HeartbeatConfig, Heartbeats, LivenessThread
from sundial_worker.incarnations import Incarnations
from sundial_worker.inflight import InFlight, OutcomeBuffer, WorkerStats
from sundial_worker.outcomes import FlushConfig, OutcomeFlusher
from sundial_worker.pool_guard import PoolGuard
from sundial_worker.sdk import Worker
from sundial_worker.supervision import SideTasks
from sundial_worker.wakeups import TopicWakes

log = logging.getLogger("sundial.worker")

_FINAL_FLUSH_SEC = 10.0


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How one worker process runs its pool: every loop's knobs in one place. Validated at construction.

    Each loop takes its own frozen config (:meth:`admission`, :meth:`execution`, …) built from these
    fields, and validates it; building them all here makes a bad field fail where the config is made.
    """

    concurrency: int = 16
    """Handlers running at once; also the most messages taken from Kafka that are not finished."""
    poll_batch: int = 256
    """Most messages taken per consume call (and so per start CAS round trip)."""
    poll_timeout_sec: float = 0.25
    """How long one consume call waits for a first message; bounds how fast the loop notices a stop."""
    heartbeat_interval_sec: float = 2.0
    """How often liveness keys of running executions are renewed."""
    heartbeat_ttl_sec: float = 6.0
    """Lifetime of a liveness key; the sweeper considers an execution lost once it expires."""
    commit_interval_sec: float = 0.5
    """How often the acknowledged offset prefix is committed to Kafka."""
    flush_max_outcomes: int = 256
    """Most outcomes written by one ``finish_attempts`` (a full buffer is written at once)."""
    flush_interval_sec: float = 0.1
    """How long the first outcome of a flush waits for company (:class:`~sundial_worker.outcomes.FlushConfig`)."""
    shutdown_grace_sec: float = 30.0
    """How long a stop waits for running handlers before abandoning them to the sweeper."""
    db_pool_size: int = 8
    """Postgres connections (start/finish batches and handlers' progress writes)."""
    cancel_poll_interval_sec: float = 0.5
    """How often the cancel flags of running executions are read (a handler sees a cancel within this)."""
    cancel_grace_sec: float = 5.0
    """How long an interrupted handler (timeout or cancel) may take to end before it is abandoned."""
    session_timeout_sec: float = 3.0
    """How long the consumer group waits for a silent member before moving its partitions to the others."""
    pool_cache_sec: float = 5.0
    """How long the pool's registry entry (the tenants it admits, :mod:`~sundial_worker.pool_guard`) is trusted."""

    def __post_init__(self) -> None:
        check_positive_int(self, "db_pool_size")
        check_seconds(self, "shutdown_grace_sec", zero_ok=True)
        check_seconds(self, "session_timeout_sec")
        check_seconds(self, "pool_cache_sec", zero_ok=True)
        self.admission()
        self.execution()
        self.heartbeats()
        self.cancel_watch()
        self.flush(FlushConfig().hot_window_sec)
        self.commits()
        self.announce()

    def admission(self) -> AdmissionConfig:
        return AdmissionConfig(
            concurrency=self.concurrency, poll_batch=self.poll_batch, poll_timeout_sec=self.poll_timeout_sec
        )

    def execution(self) -> ExecutionConfig:
        return ExecutionConfig(concurrency=self.concurrency, cancel_grace_sec=self.cancel_grace_sec)

    def heartbeats(self) -> HeartbeatConfig:
        return HeartbeatConfig(
            heartbeat_interval_sec=self.heartbeat_interval_sec, heartbeat_ttl_sec=self.heartbeat_ttl_sec
        )

    def cancel_watch(self) -> CancelWatchConfig:
        return CancelWatchConfig(cancel_poll_interval_sec=self.cancel_poll_interval_sec)

    def flush(self, hot_window_sec: int) -> FlushConfig:
        return FlushConfig(
            flush_max_outcomes=self.flush_max_outcomes,
            flush_interval_sec=self.flush_interval_sec,
            hot_window_sec=hot_window_sec,
        )

    def commits(self) -> CommitConfig:
        return CommitConfig(commit_interval_sec=self.commit_interval_sec)

    def announce(self) -> AnnounceConfig:
        # Twice the liveness TTL: a handler holding the event loop for a few seconds must not make the worker look
        # absent (the announcement is renewed from the loop, liveness keys from a thread).
        return AnnounceConfig(
            concurrency=self.concurrency, interval_sec=self.heartbeat_interval_sec, ttl_sec=2 * self.heartbeat_ttl_sec
        )


@dataclass(slots=True)
class WorkerParts:
    """What a started runtime is made of; built in :meth:`WorkerRuntime.start` once the connections are up."""

    stores: Stores
    redis: Redis
    heartbeats: Heartbeats
    liveness: LivenessThread
    cancel_watch: CancelWatch
    executor: HandlerExecutor
    admission: Admission
    flusher: OutcomeFlusher
    committer: OffsetCommitter
    wakes: TopicWakes
    announcer: Announcer


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
            settings.kafka_bootstrap,
            worker.pool,
            client_id=self.worker_id,
            session_timeout_sec=self.config.session_timeout_sec,
        )
        self.stats = WorkerStats()
        self.inflight = InFlight()
        self.outcomes = OutcomeBuffer(self.config.flush_max_outcomes)
        # Kept after stop: an abandoned sync handler's thread is still counted by stuck_sync_handlers.
        self._parts: WorkerParts | None = None
        self._force = asyncio.Event()
        self._stopping = asyncio.Event()
        self._tasks = SideTasks(self._stopping)
        self._started = False
        self._stopped = False
        self._stop_done = asyncio.Event()

    # --- what tests and the CLI read ------------------------------------------------------------

    @property
    def ready(self) -> asyncio.Event:
        """Set when the consumer has its first partition assignment."""
        return self.consumer.ready

    @property
    def parts(self) -> WorkerParts:
        """The loops of a started runtime (tests drive one pass at a time through their ``run_once``)."""
        if self._parts is None:
            raise RuntimeError("the worker runtime is not started")
        return self._parts

    @property
    def running(self) -> int:
        """Handlers running now."""
        return len(self.inflight.running)

    @property
    def stuck_sync_handlers(self) -> int:
        """Sync handler threads still running although nobody waits for them (timed out or abandoned)."""
        return 0 if self._parts is None else self._parts.executor.stuck_sync_handlers

    # --- start/stop -----------------------------------------------------------------------------

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
        stores: Stores | None = None
        redis: Redis | None = None
        try:
            # Kept open and warmed (ExecutionStore.warm_starts): opened as the first starts came, each connection's
            # first start CAS paid for the backend's first look at the executions' partitions (150-280 ms on a
            # loaded machine), and a burst's first executions and a 333/s spread's first seconds waited for it.
            stores = await Stores.connect(
                self.settings.database_url,
                min_size=1,
                max_size=self.config.db_pool_size,
                max_inactive_connection_lifetime=0,
            )
            try:
                await stores.executions.warm_starts(self.config.db_pool_size)
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
                log.warning("worker %s: connections not warmed: %r", self.worker_id, exc)
            keyring = await open_keyring(self.settings, stores.keys)  # a wrong or missing master key stops here
            redis = Redis.from_url(
                self.settings.redis_url, socket_timeout=5, socket_connect_timeout=5, health_check_interval=30
            )
            self._parts = self._build(stores, redis, keyring)
            self.parts.executor.open()
            entry = await self.parts.admission.guard.entry()
            log.info("pool %s: %s", self.worker.pool, PoolGuard.describe(entry), extra={"pool": self.worker.pool})
            # Before joining the group: what an earlier incarnation of this worker left RUNNING is lost.
            await Incarnations(
                stores, HotWindow(redis), self.worker_id, self.worker.pool, hot_window_sec=self.settings.hot_window_sec
            ).begin()
            await self.consumer.open()
            await self.parts.announcer.run_once()
        except BaseException:
            await self._close_resources(stores, redis)
            self._stopped = True
            raise
        parts = self.parts
        self._tasks.spawn("poll", parts.admission.run)
        self._tasks.spawn("flush", parts.flusher.run)
        self._tasks.spawn("commit", parts.committer.run)
        parts.liveness.start()
        self._tasks.spawn("heartbeat", parts.heartbeats.run)
        self._tasks.spawn("cancel", parts.cancel_watch.run)
        self._tasks.spawn("wakes", lambda: parts.wakes.run(self._stopping))
        self._tasks.spawn("announce", parts.announcer.run)

    def _build(self, stores: Stores, redis: Redis, keyring: Keyring) -> WorkerParts:
        config = self.config
        heartbeats = Heartbeats(
            redis, stores.executions, self.worker_id, config.heartbeats(), inflight=self.inflight, keyring=keyring
        )
        loop = asyncio.get_running_loop()

        def fail_from_thread(what: str, exc: BaseException) -> None:
            loop.call_soon_threadsafe(self._tasks.fail, what, exc)

        liveness = LivenessThread(
            # A client of its own: the asyncio one belongs to the event loop, which is what it must not depend on.
            SyncRedis.from_url(self.settings.redis_url, socket_timeout=2, socket_connect_timeout=2),
            self.worker_id,
            config.heartbeats(),
            inflight=self.inflight,
            on_failure=fail_from_thread,
        )
        executor = HandlerExecutor(
            self.worker,
            self.worker_id,
            config.execution(),
            inflight=self.inflight,
            outcomes=self.outcomes,
            heartbeats=heartbeats,
            stats=self.stats,
            keyring=keyring,
            on_failure=self._tasks.fail,
        )
        # A publisher's announcement resumes a parked consumer (sundial_worker.wakeups); admission parks only while
        # the subscription is up.
        wakes = TopicWakes(redis, pool_topic(self.worker.pool), lambda: admission.published())
        admission = Admission(
            self.consumer,
            stores.executions,
            self.worker_id,
            config.admission(),
            inflight=self.inflight,
            executor=executor,
            heartbeats=heartbeats,
            stats=self.stats,
            keyring=keyring,
            stopping=self._stopping,
            guard=PoolGuard(PoolCache(stores.pools, config.pool_cache_sec, recheck_sec=1.0), self.worker.pool),
            can_park=lambda: wakes.listening,
        )
        return WorkerParts(
            announcer=Announcer(
                WorkerAnnouncements(redis),
                self.worker,
                self.worker_id,
                config.announce(),
                busy=lambda: len(self.inflight.running),
            ),
            wakes=wakes,
            stores=stores,
            redis=redis,
            heartbeats=heartbeats,
            liveness=liveness,
            cancel_watch=CancelWatch(redis, config.cancel_watch(), inflight=self.inflight),
            executor=executor,
            admission=admission,
            flusher=OutcomeFlusher(
                stores.executions,
                self.worker_id,
                config.flush(self.settings.hot_window_sec),
                outcomes=self.outcomes,
                inflight=self.inflight,
                consumer=self.consumer,
                heartbeats=heartbeats,
                hot_window=HotWindow(redis),
                stats=self.stats,
            ),
            committer=OffsetCommitter(self.consumer, config.commits(), stats=self.stats, pool=self.worker.pool),
        )

    async def stop(self) -> None:
        """Stop taking work, finish (or after the grace, abandon) running handlers, flush, commit, leave."""
        if not self._started or self._stopped:
            self._stopped = True
            return
        if self._stopping.is_set():
            await self._stop_done.wait()  # a second caller waits for the first stop to finish
            return
        self._stopping.set()
        log.info("worker %s stopping: %d handlers running", self.worker_id, self.running)
        parts = self.parts
        try:
            await self._stop_polling(parts.admission)
            await self._tasks.cancel("announce")
            await parts.announcer.withdraw()  # no longer a worker that will take this pool's work
            abandoned = await parts.executor.finish(self.config.shutdown_grace_sec, self._force)
            # No renewal may race the release below (the thread took its list of running executions before
            # these were abandoned).
            await asyncio.to_thread(parts.liveness.stop)
            # Their liveness keys go now, so the sweeper can take these executions over without waiting
            # out the TTL; their offsets were never acknowledged, so Kafka redelivers them too.
            await parts.heartbeats.release(abandoned)
            await self._drain_outcomes(parts.flusher)
            for name in ("commit", "heartbeat", "cancel", "wakes"):
                await self._tasks.cancel(name)
            await self._close_resources(parts.stores, parts.redis)
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
            waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._tasks.crashed.wait())]
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
        finally:
            await self.stop()
        failure = self._tasks.failure
        if failure is not None:
            raise WorkerCrashed(f"worker {self.worker_id} crashed: {failure!r}") from failure

    async def wait_crashed(self) -> BaseException | None:
        await self._tasks.crashed.wait()
        return self._tasks.failure

    # --- shutdown steps ---------------------------------------------------------------------

    async def _stop_polling(self, admission: Admission) -> None:
        # The poll loop is not cancelled: cancelling it between the start CAS and launching the
        # handlers would strand RUNNING rows. It checks the stopping event at least every poll timeout.
        admission.wake()
        task = self._tasks.running("poll")
        if task is not None:
            await asyncio.wait([task])

    async def _drain_outcomes(self, flusher: OutcomeFlusher) -> None:
        task = self._tasks.running("flush")
        flusher.drain()
        if task is None:
            return
        done, _ = await asyncio.wait([task], timeout=_FINAL_FLUSH_SEC)
        if not done:
            log.error(
                "could not write %d outcomes within %.0fs; those executions stay RUNNING for the sweeper",
                len(self.outcomes),
                _FINAL_FLUSH_SEC,
            )
            await self._tasks.cancel("flush")

    async def _close_resources(self, stores: Stores | None, redis: Redis | None) -> None:
        try:
            await self.consumer.close()
        except Exception:
            log.exception("closing the Kafka consumer failed")
        if self._parts is not None:
            self._parts.liveness.stop()
            self._parts.heartbeats.close()
            self._parts.executor.close()
        if redis is not None:
            await redis.aclose()
        if stores is not None:
            await stores.close()
