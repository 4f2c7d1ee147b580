"""Liveness of running executions, and noticing their cancel requests.

:class:`LivenessThread` (thread ``sundial-liveness``, every ``heartbeat_interval_sec``) renews
``sundial:hb:<execution id>`` — value: this worker's id, TTL ``heartbeat_ttl_sec`` — for every execution it won
whose outcome is not written yet (its handler running, or ended and its outcome waiting for the flusher:
:class:`~sundial_worker.inflight.InFlight`) in ONE Redis call; the sweeper treats a RUNNING execution without that
key as lost. It is a thread
with a Redis client of its own, not an asyncio task, so that a handler holding the event loop (a busy loop, a
blocking call in an ``async def``) cannot make its worker look lost: only a stalled process (SIGSTOP, a frozen
VM) stops it. That is what lets the TTL be short (6 s by default), and the sweeper notice a dead worker in
seconds. It renews a key only where it is missing or still this worker's: a worker that was stalled past its
TTL and wakes up must not take back the key of an execution the sweeper has since given to another worker.

:class:`Heartbeats` (loop ``heartbeat``, same interval) asks Postgres which running executions have a cancel
requested (the fallback for a lost Redis flag). It also serves ``ctx.heartbeat(progress=…)`` (one key, and the
progress stored on the attempt), sets the keys of executions admission just won, and drops the keys of
executions that ended.

:class:`CancelWatch` (loop ``cancel``, every ``cancel_poll_interval_sec``) reads the cancel flags
(``sundial:cancel:<execution id>``) of every running execution in ONE Redis call and interrupts the
handlers of those flagged.

Redis trouble is never fatal here: Postgres holds the truth, and a missed renewal at worst lets the
sweeper retry an execution. Each loop sleeps first, then runs a pass; a pass that raises anything else
is a bug and fails the runtime, which is why these loops are not
:func:`sundial_common.runtime.service.every` (it logs and retries): a worker whose heartbeats silently stopped
would have its executions taken over by the sweeper while their handlers still run.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from redis import Redis as SyncRedis
from redis.asyncio import Redis
from sundial_common.hotwindow.execution_signals import (
    KEEP_LIVENESS_SCRIPT,
    RELEASE_LIVENESS_SCRIPT,
    RENEW_LIVENESS_SCRIPT,
    cancel_key,
    heartbeat_key,
)
from sundial_common.security.encryption import PROGRESS, Keyring
from sundial_common.stores.executions import ExecutionStore

from sundial_worker.errors import REDIS_ERRORS, TRANSIENT_DB_ERRORS, check_seconds
from sundial_worker.inflight import InFlight
from sundial_worker.invocation import encode_result
from sundial_worker.sdk import Context

log = logging.getLogger("sundial.worker")

_CHUNK = 1000


@dataclass(frozen=True, slots=True)
class HeartbeatConfig:
    """How liveness keys are kept. Validated at construction."""

    heartbeat_interval_sec: float = 2.0
    """How often liveness keys of running executions are renewed (and cancel requests read from Postgres)."""
    heartbeat_ttl_sec: float = 6.0
    """Lifetime of a liveness key; the sweeper considers an execution lost once it expires."""

    def __post_init__(self) -> None:
        check_seconds(self, "heartbeat_interval_sec", "heartbeat_ttl_sec")
        if self.heartbeat_ttl_sec <= self.heartbeat_interval_sec:
            raise ValueError(
                f"HeartbeatConfig.heartbeat_ttl_sec ({self.heartbeat_ttl_sec}) must exceed heartbeat_interval_sec "
                f"({self.heartbeat_interval_sec}), or liveness keys expire between renewals"
            )


class LivenessThread:
    """Renews the unsettled executions' liveness keys from a thread of its own, whatever the event loop does."""

    def __init__(
        self,
        redis: SyncRedis,
        worker_id: str,
        config: HeartbeatConfig,
        *,
        inflight: InFlight,
        on_failure: Callable[[str, BaseException], None],
    ) -> None:
        self.config = config
        self.worker_id = worker_id
        self._redis = redis
        self._keep = redis.register_script(KEEP_LIVENESS_SCRIPT)
        self._inflight = inflight
        self._on_failure = on_failure
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sundial-liveness", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop renewing (idempotent); the keys expire on their own unless released."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.config.heartbeat_interval_sec + 5)
            self._thread = None
        self._redis.close()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.config.heartbeat_interval_sec):
                self.run_once()
        except BaseException as exc:  # a bug: the runtime must not live on without heartbeats
            self._on_failure("liveness thread", exc)

    def run_once(self) -> int:
        """Renew the liveness key of every execution whose outcome is not written yet (unless another worker holds
        it); returns how many."""
        ids = self._inflight.unsettled_ids()
        if not ids:
            return 0
        keys = [heartbeat_key(e) for e in ids]
        ttl_ms = int(self.config.heartbeat_ttl_sec * 1000)
        renewed = 0
        try:
            for i in range(0, len(keys), _CHUNK):
                renewed += int(self._keep(keys=keys[i : i + _CHUNK], args=[self.worker_id, ttl_ms]))
        except REDIS_ERRORS as exc:
            # Not fatal: Postgres holds the truth; a missed renewal at worst lets the sweeper retry.
            log.warning("heartbeat renewal of %d executions failed: %s", len(ids), exc)
        return renewed


class Heartbeats:
    """Liveness keys of this worker's running executions, and ``ctx.heartbeat``. Implements the SDK's HeartbeatSink."""

    def __init__(
        self,
        redis: Redis,
        executions: ExecutionStore,
        worker_id: str,
        config: HeartbeatConfig,
        *,
        inflight: InFlight,
        keyring: Keyring,
    ) -> None:
        self.config = config
        self._keyring = keyring
        self.worker_id = worker_id
        self._redis = redis
        self._executions = executions
        self._inflight = inflight
        self._renew = redis.register_script(RENEW_LIVENESS_SCRIPT)
        self._keep = redis.register_script(KEEP_LIVENESS_SCRIPT)
        self._release = redis.register_script(RELEASE_LIVENESS_SCRIPT)
        self._closed = False

    def close(self) -> None:
        """Stop touching Redis and Postgres (they are closing): an abandoned handler's heartbeat goes nowhere."""
        self._closed = True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_interval_sec)
            await self.run_once()

    async def run_once(self) -> int:
        """Interrupt the running executions whose cancel Postgres holds; returns how many (liveness is the
        :class:`LivenessThread`'s)."""
        return await self._cancel_requests_from_postgres()

    async def renew(self, execution_ids: Sequence[UUID]) -> int:
        """Set these executions' liveness keys (this worker just won them) in one Redis call; returns how many."""
        if not execution_ids or self._closed:
            return 0
        keys = [heartbeat_key(e) for e in execution_ids]
        try:
            for i in range(0, len(keys), _CHUNK):
                await self._renew(keys=keys[i : i + _CHUNK], args=[self.worker_id, self._ttl_ms])
        except REDIS_ERRORS as exc:
            # Not fatal: Postgres holds the truth; a missed renewal at worst lets the sweeper retry.
            log.warning("heartbeat renewal of %d executions failed: %s", len(execution_ids), exc)
            return 0
        return len(execution_ids)

    @property
    def _ttl_ms(self) -> int:
        return int(self.config.heartbeat_ttl_sec * 1000)

    async def release(self, execution_ids: Sequence[UUID]) -> None:
        """Drop these executions' liveness keys where they are still this worker's."""
        if not execution_ids or self._closed:
            return
        keys = [heartbeat_key(e) for e in execution_ids]
        try:
            for i in range(0, len(keys), _CHUNK):
                await self._release(keys=keys[i : i + _CHUNK], args=[self.worker_id])
        except REDIS_ERRORS as exc:
            log.warning("could not delete %d heartbeat keys (they expire anyway): %s", len(execution_ids), exc)

    async def hold(self, execution_id: UUID, hold_sec: float) -> None:
        """Keep an accepted attempt's liveness key (still this worker's) for ``hold_sec``, then let it lapse."""
        if self._closed:
            return
        try:
            await self._keep(keys=[heartbeat_key(execution_id)], args=[self.worker_id, max(1, round(hold_sec * 1000))])
        except REDIS_ERRORS as exc:
            log.warning("could not hold the liveness of accepted attempt %s: %s", execution_id, exc)

    async def heartbeat(self, ctx: Context, progress: Any | None) -> None:
        """``ctx.heartbeat``: renew this execution's liveness key; store progress on the attempt."""
        if self._closed:
            return
        try:
            await self._keep(keys=[heartbeat_key(ctx.execution_id)], args=[self.worker_id, self._ttl_ms])
        except REDIS_ERRORS as exc:
            ctx.logger.warning("heartbeat to Redis failed: %s", exc)
        if progress is None:
            return
        encoded, problem = encode_result(progress)
        if problem is not None:
            raise TypeError(problem.replace("handler result", "progress"))
        cipher = self._keyring.cached(ctx.tenant)
        assert cipher is not None  # admission loads the tenant's key before the handler starts
        sealed = cipher.seal_json(encoded, PROGRESS)
        try:
            accepted = await self._executions.record_progress(ctx.execution_id, ctx.attempt, self.worker_id, sealed)
        except TRANSIENT_DB_ERRORS as exc:
            ctx.logger.warning("could not store progress: %s", exc)
            return
        if not accepted:
            ctx.logger.warning("progress write rejected: this attempt is no longer RUNNING on this worker")

    async def _cancel_requests_from_postgres(self) -> int:
        """The fallback for a lost Redis flag (Redis flushed or restarted): ``executions.cancel_requested_at``."""
        ids = self._inflight.not_cancelled()
        if not ids or self._closed:
            return 0
        try:
            requested = await self._executions.cancel_requested(ids)
        except TRANSIENT_DB_ERRORS as exc:
            log.warning("reading cancel requests from Postgres failed: %s", exc)
            return 0
        return self._inflight.request_cancel([e for e in ids if e in requested])


@dataclass(frozen=True, slots=True)
class CancelWatchConfig:
    """How often cancel flags are read. Validated at construction."""

    cancel_poll_interval_sec: float = 0.5
    """How often the cancel flags of running executions are read (a handler sees a cancel within this)."""

    def __post_init__(self) -> None:
        check_seconds(self, "cancel_poll_interval_sec")


class CancelWatch:
    """Reads the Redis cancel flags of running executions and interrupts the flagged handlers."""

    def __init__(self, redis: Redis, config: CancelWatchConfig, *, inflight: InFlight) -> None:
        self.config = config
        self._redis = redis
        self._inflight = inflight

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.config.cancel_poll_interval_sec)
            await self.run_once()

    async def run_once(self) -> int:
        """Read the cancel flags of every running execution in one call; interrupt those flagged. Returns how many."""
        ids = self._inflight.not_cancelled()
        if not ids:
            return 0
        try:
            flags: list[Any] = []
            for i in range(0, len(ids), _CHUNK):
                flags += await self._redis.mget([cancel_key(e) for e in ids[i : i + _CHUNK]])
        except REDIS_ERRORS as exc:
            # Postgres keeps the request too; the heartbeat pass reads it from there.
            log.warning("reading cancel flags failed: %s", exc)
            return 0
        return self._inflight.request_cancel([e for e, flag in zip(ids, flags, strict=True) if flag is not None])
