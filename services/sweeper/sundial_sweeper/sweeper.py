"""The sweeper: finds executions that fell between the cracks and moves them on.

Each pass (``run_once``) runs these scans, each bounded by ``batch_size`` rows:

(a) **Lost workers** — a RUNNING attempt whose liveness key ``sundial:hb:<execution id>`` is missing (or
    names another worker) is compare-and-swapped to ``FAILED_WORKER_LOST`` on the very worker and attempt
    it saw (``WHERE state = 'RUNNING' AND worker_id = … AND attempt = …``), which schedules its retry with
    the job's backoff, or makes it DEAD after its last attempt. Keys vanish without their worker dying when
    Redis is flushed or restarts empty, so a key must stay missing for ``lost_confirm_sec`` (longer than the
    workers' renewal interval) before its attempt is declared lost: a live worker renews it meanwhile.
(t) **Timeouts** — a RUNNING attempt past its ``timeoutSec`` (plus a grace for the worker to record it
    itself) is TIMED_OUT, whether its worker vanished or hangs: same compare-and-swap, same retry policy.
(b) **Outbox** — a PENDING execution whose Kafka message was never published (the dispatcher died between
    commit and publish, or the publish failed), or was published but not started within
    ``unstarted_after_sec`` (the broker restarted empty and lost it), is published again. Republishing is
    safe: the worker's PENDING→RUNNING compare-and-swap lets one delivery run.
(p) **Passed by the consumer group** — a PENDING execution published before the instant its pool's consumer group
    had acknowledged every message appended (:mod:`sundial_sweeper.consumed`) has no message left in the topic:
    the broker acknowledged it and dropped it. It is published again at once rather than after
    ``unstarted_after_sec``, which stays for what the group never passes (a pool with no worker).
(r) **Broker restarted empty** — every PENDING execution is published again as soon as the broker is seen to
    have lost its data (:mod:`sundial_sweeper.broker_restart`), without waiting for ``unstarted_after_sec``.
(d) **Dead letters** — a DEAD execution whose message has not reached ``sundial.dlq`` is published there
    (the execution row is that topic's outbox too), then marked; first, its ``execution.dead`` incident is
    recorded for the notification subscriptions that want it (:mod:`sundial_sweeper.incidents`).
(e) **Idempotency keys** past their 24 hours are purged.
(g) **Sampled gauges** — every ``gauges_interval_sec`` the active sweeper counts jobs per tenant and state
    (``sundial_jobs``) and DEAD executions per tenant (``sundial_dead_letter_queue_size``) in Postgres, and each pool's
    live workers, waiting work and whether it has work and no live worker (``sundial_pool_*``,
    :mod:`sundial_sweeper.pool_gauges`). One
    singleton samples them, so a sum over replicas is not a multiple of the truth; a sweeper that stops
    leading removes its series (:meth:`Sweeper.forget_gauges`).

Every pass also counts what it recovered (``sundial_sweeper_recoveries_total{reason}``) and, as the worker
does, the attempts it ended (finished by state, retries, dead letters; see :mod:`sundial_common.observability.metrics`).

Scan (c) of the issue — a scheduled retry whose hot-window member was lost — is the hydrator's: it owns
Postgres' view of "due soon" in Redis, and its watermark and overdue scan cover retries as they cover jobs.

Time is Postgres' (``now()`` comes back with the rows), so the sweeper's clock does not decide who is late.
Several sweepers may run at once (every write is a compare-and-swap); one is active through an etcd lease
only so that N replicas do not scan N times.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING
from uuid import UUID

from prometheus_client import Gauge
from redis.asyncio import Redis
from sundial_common.broker.kafka import Publisher
from sundial_common.broker.messages import DLQ_TOPIC, DeadLetter
from sundial_common.broker.outbox import OutboxSender
from sundial_common.hotwindow.window import HotWindow
from sundial_common.observability.metrics import (
    DEAD_LETTER_QUEUE_SIZE,
    JOBS,
    SWEEPER_RECOVERIES,
    Children,
)
from sundial_common.observability.tracing import (
    traceparent,
)
from sundial_common.runtime.clock import Clock, SystemClock
from sundial_common.runtime.crashpoints import crash_point
from sundial_common.stores import Stores
from sundial_common.stores.types import Record

from sundial_sweeper.incidents import dead_incidents
from sundial_sweeper.lost_attempts import LostAttempts, LostAttemptsConfig
from sundial_sweeper.pool_gauges import PoolGauges
from sundial_sweeper.resends import execution_message, send_span

if TYPE_CHECKING:
    from sundial_sweeper.broker_restart import BrokerRestartRepublisher
    from sundial_sweeper.consumed import ConsumedHorizon

log = logging.getLogger(__name__)

#: The reasons of sundial_sweeper_recoveries_total.
_RECOVERY_REASONS = ("worker_lost", "timed_out", "republished")
#: Scan (p) sends an attempt again at once the first time, then waits this long, doubled each time (at most the
#: outbox's unstarted window): a message a worker acknowledges without starting it (undecodable) would otherwise be
#: passed and sent again every few seconds, for ever.
_PASSED_BACKOFF_SEC = 5.0


@dataclass(frozen=True)
class SweeperConfig:
    #: A PENDING execution not published this many seconds after dispatch is published again.
    unpublished_after_sec: float = 5.0
    #: A PENDING execution published this long ago and still not started is published again.
    unstarted_after_sec: float = 60.0
    #: Rows per scan and pass.
    batch_size: int = 1000
    #: Seconds between passes.
    interval_sec: float = 2.0
    #: The workers' liveness TTL: an attempt younger than this may not have its first key yet.
    heartbeat_ttl_sec: float = 6.0
    #: How long a liveness key must stay missing before its attempt is lost; must exceed the workers'
    #: renewal interval (2 s), so that a flushed Redis does not turn every running execution into a retry:
    #: the workers renew from a thread a handler cannot block, so a live worker's next renewal is never
    #: later than that interval (plus a Redis round trip). A worker that died is noticed TTL + this after
    #: its last renewal (~10 s), or at once when it comes back (it declares its previous incarnation lost).
    lost_confirm_sec: float = 4.0
    #: A RUNNING attempt this long past its timeoutSec is TIMED_OUT by the sweeper (its worker would have
    #: recorded it by then: it interrupts the handler at the deadline and waits its cancel grace, 5 s).
    timeout_grace_sec: float = 15.0
    #: Who the audit log names for the sweeper's writes.
    actor: str = "sweeper"
    #: Retries due within this horizon go straight into the hot window (the hydrator promotes later ones).
    hot_window_sec: int = 3600
    #: Seconds between samples of the job and dead-letter gauges (a scan of jobs each: not every pass).
    gauges_interval_sec: float = 15.0
    #: How far Postgres' clock may be from the sweeper's: scan (p) sends an execution again only if it was published
    #: this long before its pool's consumer group had acknowledged every message appended.
    clock_skew_sec: float = 1.0

    def __post_init__(self) -> None:
        positive = (
            "unpublished_after_sec",
            "unstarted_after_sec",
            "interval_sec",
            "heartbeat_ttl_sec",
            "gauges_interval_sec",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"SweeperConfig.{name} must be > 0")
        if self.lost_confirm_sec < 0 or self.timeout_grace_sec < 0 or self.clock_skew_sec < 0:
            raise ValueError("SweeperConfig.lost_confirm_sec, timeout_grace_sec and clock_skew_sec must be >= 0")
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")

    def lost_attempts(self) -> LostAttemptsConfig:
        return LostAttemptsConfig(
            batch_size=self.batch_size,
            heartbeat_ttl_sec=self.heartbeat_ttl_sec,
            lost_confirm_sec=self.lost_confirm_sec,
            timeout_grace_sec=self.timeout_grace_sec,
            actor=self.actor,
            hot_window_sec=self.hot_window_sec,
        )


@dataclass(frozen=True)
class SweepResult:
    republished: int = 0
    publish_failed: int = 0
    #: Attempts whose worker was lost (FAILED_WORKER_LOST, or DEAD/CANCELLED where that applies).
    lost: int = 0
    #: Attempts that ran past their timeout.
    timed_out: int = 0
    #: Liveness keys seen missing for the first time (not yet confirmed lost).
    suspected: int = 0
    dead_lettered: int = 0
    keys_purged: int = 0
    #: PENDING executions sent again because the broker restarted empty (scan r).
    republished_after_broker_restart: int = 0
    #: PENDING executions sent again because their pool's consumer group had passed their message (scan p).
    republished_passed: int = 0


def _dead_letter(row: Record, parent: str | None) -> DeadLetter:
    finished: datetime | None = row["finished_at"]
    return DeadLetter(
        execution_id=str(row["id"]),
        job_id=str(row["job_id"]),
        tenant_id=row["tenant_id"],
        pool=row["pool"],
        handler=row["handler"],
        attempt=row["attempt"],
        fence_token=0,
        scheduled_for=row["scheduled_for"].isoformat(),
        timeout_sec=0,
        payload=row["payload"],
        error=row["error"],
        max_attempts=row["max_attempts"],
        job_name=row["job_name"],
        finished_at=finished.isoformat() if finished else None,
        trace_id=row["trace_id"],
        traceparent=parent,
    )


class Sweeper:
    """The sweeper's scans over the stores, a publisher and (for liveness) Redis; one ``run_once`` per pass."""

    def __init__(
        self,
        stores: Stores,
        publisher: Publisher,
        config: SweeperConfig,
        clock: Clock | None = None,
        *,
        redis: Redis | None = None,
        broker_restart: BrokerRestartRepublisher | None = None,
        consumed: ConsumedHorizon | None = None,
    ) -> None:
        self.broker_restart = broker_restart
        self.consumed = consumed
        self.stores = stores
        self.publisher = publisher
        #: Every message the sweeper sends leaves through the outbox sender (spans, counts, marks in one place).
        self.republisher = OutboxSender(publisher, "republish")
        self.dead_letterer = OutboxSender(publisher, "dead_letter")
        self.config = config
        self.clock = clock or SystemClock()
        self.redis = redis
        self.hot_window = HotWindow(redis) if redis is not None else None
        self.lost_attempts = LostAttempts(
            stores.executions, config.lost_attempts(), self.clock, redis=redis, hot_window=self.hot_window
        )
        # (execution, attempt) → (times scan (p) sent it again, monotonic time of the last).
        self._passed_sent: dict[tuple[UUID, int], tuple[int, float]] = {}
        self._recovered = {reason: SWEEPER_RECOVERIES.labels(reason) for reason in _RECOVERY_REASONS}
        self._jobs: Children[Gauge] = Children(JOBS)
        self._dead: Children[Gauge] = Children(DEAD_LETTER_QUEUE_SIZE)
        self._pools = PoolGauges(redis, stores.executions)
        self._gauges_sampled_at = float("-inf")
        if redis is None:
            log.warning("sweeper without Redis: lost workers are not detected (timeouts still are)")

    async def run_once(self) -> SweepResult:
        restart = await self.broker_restart.run_once() if self.broker_restart is not None else None
        after_restart = restart.republished if restart is not None else 0
        lost, timed_out, suspected = await self.sweep_running()
        republished, failed = await self.republish_stale()
        passed, passed_failed = await self.republish_passed()
        republished += after_restart + passed
        failed += passed_failed
        dead_lettered = await self.publish_dead_letters()
        purged = await self.stores.idempotency.purge_idempotency_keys(self.config.batch_size)
        for reason, count in (("worker_lost", lost), ("timed_out", timed_out), ("republished", republished)):
            if count:
                self._recovered[reason].inc(count)
        if self.clock.monotonic() - self._gauges_sampled_at >= self.config.gauges_interval_sec:
            await self.sample_gauges()
        return SweepResult(
            republished=republished,
            publish_failed=failed,
            lost=lost,
            timed_out=timed_out,
            suspected=suspected,
            dead_lettered=dead_lettered,
            keys_purged=purged,
            republished_after_broker_restart=after_restart,
            republished_passed=passed,
        )

    # --- (a) and (t): RUNNING attempts whose worker is gone or that ran past their timeout (lost_attempts) --

    async def sweep_running(self) -> tuple[int, int, int]:
        """Returns (attempts declared lost, attempts timed out, keys newly suspected)."""
        swept = await self.lost_attempts.run_once()
        return swept.lost, swept.timed_out, swept.suspected

    # --- (g): gauges sampled from Postgres -----------------------------------------------------------

    async def sample_gauges(self) -> None:
        """Set ``sundial_jobs`` and ``sundial_dead_letter_queue_size`` from Postgres; series gone from it go."""
        jobs = await self.stores.jobs.count_jobs()
        dead = await self.stores.executions.count_dead()
        self._gauges_sampled_at = self.clock.monotonic()
        self._jobs.forget(jobs)
        for key, count in jobs.items():
            self._jobs(*key).set(count)
        self._dead.forget((tenant,) for tenant in dead)
        for tenant, count in dead.items():
            self._dead(tenant).set(count)
        await self._pools.sample()

    def forget_gauges(self) -> None:
        """Remove the sampled series: a sweeper that stopped leading must not report stale counts beside the
        new leader's."""
        self._jobs.forget()
        self._dead.forget()
        self._pools.forget()
        self._gauges_sampled_at = float("-inf")

    # --- (b): the outbox of the pools' topics ----------------------------------------------------------

    async def republish_stale(self) -> tuple[int, int]:
        """Returns (republished, publish failures)."""
        now = self.clock.now()
        rows = await self.stores.dispatch.stale_pending(
            now - timedelta(seconds=self.config.unpublished_after_sec),
            now - timedelta(seconds=self.config.unstarted_after_sec),
            self.config.batch_size,
        )
        if not rows:
            return 0, 0
        sent, failed = await self._republish(rows)
        log.warning("republished %d stale PENDING executions (%d failed, retried next pass)", sent, failed)
        return sent, failed

    async def republish_passed(self) -> tuple[int, int]:
        """Scan (p): the PENDING executions whose pool's consumer group has passed their message without starting
        them (the broker dropped it), sent again. Returns (republished, publish failures).

        Only pools with PENDING executions published are read (nothing while idle); each pass's read is also the
        sample a later pass compares the group's progress with, so a drop is found within a few passes."""
        if self.consumed is None:
            return 0, 0
        consumed = self.consumed
        oldest = await self.stores.dispatch.published_pending_pools()
        consumed.forget(set(oldest))  # a dict only: no broker call
        skew = timedelta(seconds=self.config.clock_skew_sec)
        rows: list[Record] = []
        for pool, published in oldest.items():
            horizon = await asyncio.to_thread(consumed.horizon, pool, published + skew)
            if horizon is not None and published < horizon - skew:
                rows += await self.stores.dispatch.passed_pending(pool, horizon - skew, self.config.batch_size)
        rows = self._backed_off(rows)
        if not rows:
            return 0, 0
        sent, failed = await self._republish(rows)
        log.warning(
            "republished %d PENDING executions whose messages their consumer group passed without a start (the broker"
            " dropped them; %d failed, sent again later)",
            sent,
            failed,
        )
        return sent, failed

    def _backed_off(self, rows: Sequence[Record]) -> list[Record]:
        """Of the rows scan (p) found passed, those due to be sent again: an attempt sent again n times by it waits
        ``_PASSED_BACKOFF_SEC`` · 2ⁿ⁻¹ (at most ``unstarted_after_sec``) since the last. Entries idle for twice that
        window are forgotten (their executions started, or the outbox scan keeps sending them)."""
        now = self.clock.monotonic()
        window = self.config.unstarted_after_sec
        for key in [k for k, (_, last) in self._passed_sent.items() if now - last > 2 * window]:
            del self._passed_sent[key]
        due: list[Record] = []
        for row in rows:
            key = (row["id"], row["attempt"])
            times, last = self._passed_sent.get(key, (0, float("-inf")))
            if times and now - last < min(_PASSED_BACKOFF_SEC * 2 ** (times - 1), window):
                continue
            self._passed_sent[key] = (times + 1, now)
            due.append(row)
        return due

    async def _republish(self, rows: Sequence[Record]) -> tuple[int, int]:
        """Publish the rows' messages again and mark them republished; returns (sent, failed)."""
        spans = [send_span(row, "republish") for row in rows]
        messages = [
            execution_message(row, traceparent(span) or row["traceparent"])
            for row, span in zip(rows, spans, strict=True)
        ]
        sent = await self.republisher.send(
            messages, [row["id"] for row in rows], spans, mark=self.stores.dispatch.republished
        )
        return len(sent.sent), sent.failed

    # --- (d): the outbox of sundial.dlq -----------------------------------------------------------------

    async def publish_dead_letters(self) -> int:
        rows = await self.stores.executions.dead_letters(self.config.batch_size)
        if not rows:
            return 0
        # Before the rows are marked: a pass that dies after this records them again, as nothing new.
        await self.stores.notifications.record_incidents(dead_incidents(rows))
        crash_point("sweeper.after_incidents")  # recorded, not published nor marked: the next pass's again
        spans = [send_span(row, "dead letter", DLQ_TOPIC) for row in rows]
        sent = await self.dead_letterer.send(
            [_dead_letter(row, traceparent(span)) for row, span in zip(rows, spans, strict=True)],
            [row["id"] for row in rows],
            spans,
            mark=self.stores.executions.mark_dead_lettered,
        )
        if sent.failed:
            log.warning("%d dead letters not published (retried next pass)", sent.failed)
        return len(sent.sent)
