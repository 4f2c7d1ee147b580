"""Admission: taking messages from Kafka and claiming their executions with one start CAS per batch.

The :class:`Admission` loop (``poll``) takes at most as many messages as there are free handler slots,
decodes them, and claims the whole batch with ONE ``executions.start_executions`` (compare-and-swap PENDING →
RUNNING, DESIGN invariant 3). A won execution whose tenant the pool does not admit
(:mod:`~sundial_worker.pool_guard`) ends FAILED at once without its handler. A message that loses the CAS —
a duplicate delivery, an attempt that is no longer current — is acknowledged without running
(invariant 5); an undecodable one is skipped loudly and acknowledged, a marker (no value: the sweeper's, see
:mod:`sundial_common.broker.messages`) quietly. Each won execution's handler starts through the
:class:`~sundial_worker.execution.HandlerExecutor`, and then the won executions' liveness keys are renewed
(the Redis round trip overlaps the handlers' start).

A message published ahead of its due instant (it carries ``due_at``) is not claimed on receipt: it waits in
:mod:`~sundial_worker.holding`, outside the slots and unacknowledged, and is claimed when that instant comes (before
the loop takes more from Kafka, if slots are short).

The loop is not on a timer: a pass waits for messages up to ``poll_timeout_sec`` (or, with no slot free,
for a handler to end), so it runs back to back until the runtime's ``stopping`` event is set. A batch's claim
(CAS, launch, liveness write) runs as a task of its own while the loop takes the next batch, at most two at once:
in a 333/s spread a message that reached the worker while the loop waited for a claim's round trip came ~3 ms later
(P50) than one the loop was already waiting for. A message taken while an earlier claim of its execution is in flight
joins that claim. A slot is free when neither a handler nor a claim in flight holds it. Neither the loop nor a
claim is ever cancelled — cancelling one between the start CAS and launching the handlers would strand RUNNING
rows — so the loop checks that event at least every poll timeout and, stopping, waits for its claims; a claim
that finds it set leaves its messages unacknowledged for the group's next member.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar
from uuid import UUID

import orjson
from sundial_common.broker.messages import ExecutionMessage
from sundial_common.domain.ids import parse_id
from sundial_common.security.encryption import Keyring
from sundial_common.stores.executions import ExecutionStore
from sundial_common.stores.types import Record

from sundial_worker.consumer import Delivery, ExecutionConsumer
from sundial_worker.errors import TRANSIENT_DB_ERRORS, check_positive_int, check_seconds
from sundial_worker.execution import HandlerExecutor
from sundial_worker.heartbeats import Heartbeats
from sundial_worker.holding import Holding
from sundial_worker.inflight import InFlight, WorkerStats
from sundial_worker.pool_guard import PoolGuard

log = logging.getLogger("sundial.worker")

# Capped low: messages wait on this retry while Postgres restarts, and every second of it is a second of
# lateness once Postgres is back (the fault tests hold max lateness <= the outage + 1 s). A retry is one connect
# attempt.
_BACKOFF_MAX_SEC = 0.5
#: How long a parked consumer's periodic look waits: a few broker fetches.
_PARK_CHECK_WAIT_SEC = 0.03
#: Claims (start CAS, launch, liveness write) in flight at once: while one waits for Postgres the loop takes the
#: next batch, so what arrives meanwhile does not wait for that round trip.
_CLAIMS_IN_FLIGHT = 2
#: Messages held for their due instant (sundial_worker.holding), in poll batches: beyond it, the loop takes no more.
_HELD_BATCHES = 4
#: A held message is claimed this long before its instant: the start CAS's round trip is done by then, and its
#: handler is launched at the instant itself.
_HELD_LEAD_SEC = 0.02
#: Held messages coming due within this of the earliest are claimed with it: one start CAS (and one liveness write)
#: for all of them, each handler still launched at its own instant; what it costs is only that they show RUNNING
#: (their ``started_at`` the instant they are to be launched at) up to this long before it. A spread stream pays
#: a start transaction per 1 + rate x gather executions: at 50 due a second on two workers, ~7 rather than ~2.
_HELD_GATHER_SEC = 0.2


_R = TypeVar("_R")


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """How messages are taken. Validated at construction."""

    concurrency: int = 16
    """Handlers running at once; also the most messages taken from Kafka that are not finished."""
    poll_batch: int = 256
    """Most messages taken per consume call (and so per start CAS round trip)."""
    poll_timeout_sec: float = 0.25
    """How long one consume call waits for a first message; bounds how fast the loop notices a stop."""
    idle_park_sec: float = 0.15
    """After this long without a message the consumer parks (no broker fetch) until a publisher wakes it. A sparse
    stream published ahead arrives in a burst per dispatch pass (a few a second), so its workers park between them
    rather than fetch every 10 ms. Longer than the publishers' quiet time between wake-ups of a topic
    (:data:`~sundial_common.broker.wakeups.WAKE_QUIET_SEC`): a batch sent unannounced then still finds this worker
    fetching."""
    park_check_sec: float = 1.0
    """A parked consumer still fetches this often (a wake-up lost, a publisher that does not announce)."""

    def __post_init__(self) -> None:
        check_positive_int(self, "concurrency", "poll_batch")
        check_seconds(self, "poll_timeout_sec", "idle_park_sec", "park_check_sec")


#: A decoded message: its delivery, body, execution id and due instant (epoch seconds; None: due now).
_Decoded = tuple[Delivery, ExecutionMessage, UUID, float | None]


@dataclass(eq=False, slots=True)
class _Claim:
    message: ExecutionMessage
    execution_id: UUID
    deliveries: list[Delivery] = field(default_factory=list)
    #: The instant its handler is launched at (epoch seconds), if it was published ahead; None: at once.
    due: float | None = None


class Admission:
    """Consumes a pool's messages, wins their executions' start CAS, and launches their handlers."""

    def __init__(
        self,
        consumer: ExecutionConsumer,
        executions: ExecutionStore,
        worker_id: str,
        config: AdmissionConfig,
        *,
        inflight: InFlight,
        executor: HandlerExecutor,
        heartbeats: Heartbeats,
        stats: WorkerStats,
        keyring: Keyring,
        stopping: asyncio.Event,
        guard: PoolGuard,
        can_park: Callable[[], bool] = lambda: False,
    ) -> None:
        self.config = config
        #: True while wake-ups arrive (sundial_worker.wakeups): only then may an idle consumer stop fetching.
        self._can_park = can_park
        #: Set by a publisher's wake-up (:meth:`published`): a parked consumer fetches at once.
        self._published = asyncio.Event()
        self._last_delivery = self._last_fetch = time.monotonic()
        self._keyring = keyring
        self.guard = guard
        self.worker_id = worker_id
        self._consumer = consumer
        self._executions = executions
        self._inflight = inflight
        self._executor = executor
        self._heartbeats = heartbeats
        self._stats = stats
        self._stopping = stopping
        #: The executions whose start CAS is in flight (each holds a slot until it is launched or lost).
        self._claiming: dict[tuple[UUID, int], _Claim] = {}
        #: The claims' tasks in flight.
        self._claims: set[asyncio.Task[None]] = set()
        #: Messages published ahead of their due instant, waiting for it outside the handler slots.
        self._holding: Holding[_Decoded] = Holding(
            _HELD_BATCHES * config.poll_batch, self._release_held, lead_sec=_HELD_LEAD_SEC, gather_sec=_HELD_GATHER_SEC
        )

    async def run(self) -> None:
        """Take and claim until stopping, a batch's claim overlapping the next take (at most
        ``_CLAIMS_IN_FLIGHT`` at once). Claims are never cancelled: a stop waits for them."""
        holding = asyncio.create_task(self._holding.run(self._stopping), name="sundial-worker-holding")
        try:
            while not self._stopping.is_set():
                deliveries = await self._next()
                self._start_claim(*self._collect(deliveries))
                if len(self._claims) >= _CLAIMS_IN_FLIGHT:
                    await asyncio.wait(self._claims, return_when=asyncio.FIRST_COMPLETED)
                self._claims = self._reap(self._claims)
                if holding.done():  # the holding timer ends only with a stop, or by a bug: raise it
                    holding.result()
        finally:
            holding.cancel()  # between two releases: each is synchronous, and what it claimed is in _claims
            await asyncio.wait([holding])
            self._holding.drain()  # unacknowledged: the group's next member gets them
            if self._claims:
                await asyncio.wait(self._claims)
            self._reap(self._claims)

    def _start_claim(self, batch: dict[tuple[UUID, int], _Claim], duplicates: int) -> None:
        if batch:
            self._claims.add(asyncio.create_task(self._claim(batch, duplicates), name="sundial-worker-claim"))

    def _free(self) -> int:
        """Handler slots neither a handler nor a claim in flight holds."""
        return self.config.concurrency - len(self._inflight.running) - len(self._claiming)

    def _release_held(self) -> None:
        """Claim the held messages whose instant has come, as many as there are free slots (the rest are taken first
        as slots free: :meth:`_next`). Synchronous, like :meth:`_collect`, so the slots are counted at once."""
        free = self._free()
        if free > 0 and not self._stopping.is_set():
            self._start_claim(*self._gather(self._holding.due(free)))

    @staticmethod
    def _reap(claims: set[asyncio.Task[None]]) -> set[asyncio.Task[None]]:
        """The claims still in flight; a finished one's exception (a bug, or Postgres down for good) is raised."""
        for task in claims:
            if task.done():
                task.result()
        return {task for task in claims if not task.done()}

    def wake(self) -> None:
        """Cut short a pass waiting for a free slot or parked (so that it notices a stop at once)."""
        self._inflight.slot_freed.set()
        self._published.set()
        self._holding.wake()

    def published(self) -> None:
        """A publisher announced this pool's topic (sundial_worker.wakeups): a parked consumer fetches now."""
        self._published.set()

    async def _next(self) -> list[Delivery]:
        """Up to the free slots' worth of messages (a slot is free if no handler holds it and no claim in flight
        may give it one); none when every slot is taken (the group served meanwhile) or nothing came."""
        if self._holding.waiting():  # held messages now due take the free slots first
            self._release_held()
        free = self._free()
        if free <= 0 or self._holding.full():
            slot_freed = self._inflight.slot_freed
            slot_freed.clear()
            try:
                await asyncio.wait_for(slot_freed.wait(), self.config.poll_timeout_sec)
            except TimeoutError:
                await self._consumer.keepalive(0)
            self._last_delivery = time.monotonic()  # saturated is not idle
            return []
        deliveries = await self._take(min(free, self.config.poll_batch))
        if deliveries:
            self._last_delivery = time.monotonic()
            self._stats.consumed += len(deliveries)
        return deliveries

    async def _take(self, most: int) -> list[Delivery]:
        """Poll while work flows. Idle for ``idle_park_sec`` (and wake-ups arriving): park, and wait for a
        wake-up, at most ``poll_timeout_sec`` (serving the group between waits); fetch every ``park_check_sec``."""
        now = time.monotonic()
        published = self._published.is_set()
        self._published.clear()
        if published or now - self._last_delivery < self.config.idle_park_sec or not self._can_park():
            self._last_fetch = now
            return await self._consumer.poll(most, self.config.poll_timeout_sec)
        if now - self._last_fetch >= self.config.park_check_sec:
            self._last_fetch = now
            return await self._consumer.poll(most, _PARK_CHECK_WAIT_SEC)
        parked = await self._consumer.park(most)
        if parked:
            return parked
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._published.wait(), self.config.poll_timeout_sec)
        return []

    def _collect(self, deliveries: Sequence[Delivery]) -> tuple[dict[tuple[UUID, int], _Claim], int]:
        """The batch's claims (:meth:`_gather`), after setting aside the messages published ahead of their due
        instant (held until it comes: :mod:`sundial_worker.holding`)."""
        due: list[_Decoded] = []
        for delivery in deliveries:
            decoded = self._decode(delivery)
            if decoded is None:
                continue
            instant = decoded[3]
            if instant is not None and self._holding.holds(instant):
                self._holding.hold(instant, decoded)
            else:
                due.append(decoded)
        return self._gather(due)

    def _gather(self, decoded: Sequence[_Decoded]) -> tuple[dict[tuple[UUID, int], _Claim], int]:
        """The batch's claims, held in :attr:`_claiming` (their slots taken) from now on, and its duplicates so far.

        No claims if stopping, or if every delivery was undecodable or a duplicate. Synchronous, so that the loop's
        next pass counts these claims' slots as taken."""
        claims: dict[tuple[UUID, int], _Claim] = {}
        duplicates = 0
        for delivery, message, execution_id, instant in decoded:
            unsettled = self._inflight.unsettled.get(execution_id)
            if unsettled is not None and unsettled.attempt == message.attempt:
                # Redelivered before its outcome is written (a rebalance handed the partition back):
                # the CAS would lose and acknowledge it at once, letting the commit pass a message
                # whose write is not done. Its offset is acknowledged with the outcome instead.
                unsettled.deliveries.append(delivery)
                duplicates += 1
                continue
            key = (execution_id, message.attempt)
            # Also one in another claim still in flight: it goes with that claim (acknowledged with its outcome, or
            # at once if that CAS loses), counted as a duplicate once that CAS has decided.
            claim = claims.get(key) or self._claiming.get(key)
            if claim is None:
                claims[key] = _Claim(message, execution_id, [delivery], instant)
            else:
                claim.deliveries.append(delivery)
        if not claims or self._stopping.is_set():
            # Stopping: leave these unacknowledged; their offsets stay uncommitted and another member
            # (or this one, restarted) gets them again.
            self._stats.duplicates += duplicates
            return {}, duplicates
        self._claiming.update(claims)
        return claims, duplicates

    async def _claim(self, claims: dict[tuple[UUID, int], _Claim], duplicates: int) -> None:
        """The start CAS of the claims :meth:`_collect` made, then their handlers' launch (or their acknowledgement,
        if lost)."""
        try:
            await self._decide(claims, duplicates)
        finally:
            if any(self._claiming.pop(key, None) for key in claims):  # ended before deciding (stopping, an error)
                self._inflight.slot_freed.set()

    async def _decide(self, claims: dict[tuple[UUID, int], _Claim], duplicates: int) -> None:
        # The data keys of the batch's tenants before the start CAS (a row won must have its handler started):
        # a read only for a tenant this process has not seen yet, else nothing.
        tenants = {c.message.tenant_id for c in claims.values()}
        if any(self._keyring.cached(t) is None for t in tenants):
            loaded = await self._with_db_retry("load data keys", lambda _: self._keyring.ciphers(tenants))
            if loaded is None:
                return
        launch_at = [None if c.due is None else datetime.fromtimestamp(c.due, UTC) for c in claims.values()]
        rows = await self._with_db_retry(
            "start executions",
            lambda executions: executions.start_executions(
                self.worker_id, list(claims), [c.deliveries[0].published_at for c in claims.values()], launch_at
            ),
        )
        if rows is None:  # stopping while the database was unreachable
            return
        # asyncpg's UUIDs hash and compare as uuid.UUID does: no conversion per row.
        won: dict[UUID, Record] = {row["id"]: row for row in rows}
        started: list[UUID] = []
        # One cached registry read per pass (a query only when the entry is older than pool_cache_sec), and one
        # fresh read before refusing anything (the entry may predate a tenant admitted since).
        pool = await self.guard.entry() if won else None
        if any(
            not self.guard.admits(pool, r["tenant_id"], claims[(i, r["attempt"])].message.tenant_id)
            for i, r in won.items()
            if (i, r["attempt"]) in claims
        ):
            pool = await self.guard.fresh_entry()
        # From here on nothing awaits until every claim is launched or acknowledged: a redelivery taken meanwhile
        # finds its execution unsettled (launched) or claims it anew (acknowledged), never a decided claim.
        for key in claims:
            self._claiming.pop(key, None)
        self._inflight.slot_freed.set()  # a lost claim's slot is free; a won one's is its handler's now
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
            refusal = self.guard.refusal(pool, row["tenant_id"], claim.message.tenant_id)
            if refusal is not None:
                self._executor.refuse(execution_id, claim.message, claim.deliveries, row, refusal)
                continue
            self._executor.launch(execution_id, claim.message, claim.deliveries, row, at=claim.due)
            started.append(execution_id)
        self._stats.duplicates += duplicates
        self._stats.started += len(started)
        # Liveness keys go out after the handlers have started, so the Redis round trip overlaps them.
        await self._heartbeats.renew(started)

    def _decode(self, delivery: Delivery) -> _Decoded | None:
        if delivery.value is None:
            # A marker (sundial_common.broker.messages): the sweeper's, to see the group pass it. Nothing to run.
            self._ack([delivery])
            return None
        try:
            message = ExecutionMessage.decode(delivery.value)
            due = None if message.due_at is None else datetime.fromisoformat(message.due_at).timestamp()
            return delivery, message, parse_id(message.execution_id), due
        except (ValueError, TypeError, orjson.JSONDecodeError) as exc:
            # Nothing can ever run it, and it must not block the partition's commits: skip it loudly.
            log.error(
                "skipping undecodable message %s[%d]@%d: %s", delivery.topic, delivery.partition, delivery.offset, exc
            )
            self._stats.undecodable += 1
            self._ack([delivery])
            return None

    def _ack(self, deliveries: Sequence[Delivery]) -> None:
        for delivery in deliveries:
            self._consumer.ack(delivery)

    async def _with_db_retry(self, what: str, call: Callable[[ExecutionStore], Coroutine[Any, Any, _R]]) -> _R | None:
        backoff = 0.05
        while True:
            try:
                return await call(self._executions)
            except TRANSIENT_DB_ERRORS as exc:
                if self._stopping.is_set():
                    log.error("%s failed while stopping; giving up: %s", what, exc)
                    return None
                log.error("%s failed, retrying in %.2fs: %s", what, backoff, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX_SEC)
