"""Scans (a) and (t) of the sweeper: RUNNING attempts whose worker is gone, or that ran past their timeout.

A RUNNING attempt whose liveness key ``sundial:hb:<execution id>`` is missing (or names another worker) for
``lost_confirm_sec`` is ended ``FAILED_WORKER_LOST``; one past its ``timeoutSec`` plus a grace, ``TIMED_OUT``.
Both through one compare-and-swap on the very worker and attempt seen, which schedules the retry with the job's
backoff (retries due within the hot-window horizon go straight into Redis) or makes the execution DEAD. Each
ended attempt gets an error span in the execution's trace. See :mod:`sundial_sweeper.sweeper` for why a missing
key must stay missing before its attempt is declared lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from opentelemetry.trace import Status, StatusCode
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sundial_common.domain.retry_policy import RetryPolicy
from sundial_common.hotwindow.execution_signals import heartbeat_key
from sundial_common.hotwindow.window import HotWindow
from sundial_common.observability.metrics import AttemptsEnded
from sundial_common.observability.tracing import FAILURE, execution_attributes, execution_context, tracer
from sundial_common.runtime.clock import Clock
from sundial_common.stores.executions import ExecutionStore, Finished, LostAttempt
from sundial_common.stores.types import Record

log = logging.getLogger("sundial_sweeper.sweeper")

REDIS_ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)
# RUNNING rows looked at per pass, at most: pages of batch_size.
_MAX_RUNNING_PAGES = 20


@dataclass(frozen=True)
class LostAttemptsConfig:
    """The sweeper's settings these scans use (:meth:`~sundial_sweeper.sweeper.SweeperConfig.lost_attempts`)."""

    batch_size: int
    heartbeat_ttl_sec: float
    lost_confirm_sec: float
    timeout_grace_sec: float
    actor: str
    hot_window_sec: int


@dataclass(frozen=True)
class RunningSwept:
    """What one pass of :meth:`LostAttempts.run_once` ended."""

    #: Attempts whose worker was lost (FAILED_WORKER_LOST, or DEAD/CANCELLED where that applies).
    lost: int = 0
    #: Attempts that ran past their timeout.
    timed_out: int = 0
    #: Liveness keys seen missing for the first time (not yet confirmed lost).
    suspected: int = 0


@dataclass
class _Running:
    """What one scan of the RUNNING executions found."""

    timed_out: list[LostAttempt] = field(default_factory=list)
    #: Attempts old enough to have a liveness key, to check in Redis.
    to_check: list[Record] = field(default_factory=list)
    #: Every scanned row by execution id: the parent of the span of whatever the sweeper does to it.
    rows: dict[UUID, Record] = field(default_factory=dict)


class LostAttempts:
    """Ends the RUNNING attempts whose worker is gone or that ran past their timeout; one ``run_once`` per pass."""

    def __init__(
        self,
        executions: ExecutionStore,
        config: LostAttemptsConfig,
        clock: Clock,
        *,
        redis: Redis | None,
        hot_window: HotWindow | None,
    ) -> None:
        self.executions = executions
        self.config = config
        self.clock = clock
        self.redis = redis
        self.hot_window = hot_window
        # (execution, attempt) → monotonic time its liveness key was first seen missing.
        self._missing_since: dict[tuple[UUID, int], float] = {}
        self._attempts_ended = AttemptsEnded()

    async def run_once(self) -> RunningSwept:
        found = await self._scan_running()
        lost, suspected = await self._lost(found.to_check)
        started_ns = time.time_ns()
        ended = await self.executions.fail_running(self.config.actor, found.timed_out + lost)
        for f in ended:
            _trace_recovery(found.rows[f.execution_id], f, started_ns)
        timed_out = sum(1 for f in ended if f.attempt_state == "TIMED_OUT")
        self._attempts_ended.record((f.tenant_id, f.pool, f.state, f.next_attempt_at is not None) for f in ended)
        await self._schedule_retries(ended)
        if ended:
            log.warning(
                "ended %d attempts: %d lost their worker, %d ran past their timeout (%d retries scheduled, %d DEAD)",
                len(ended),
                len(ended) - timed_out,
                timed_out,
                sum(1 for f in ended if f.next_attempt_at is not None),
                sum(1 for f in ended if f.state == "DEAD"),
            )
        for f in ended:
            self._missing_since.pop((f.execution_id, f.attempt), None)
        return RunningSwept(lost=len(ended) - timed_out, timed_out=timed_out, suspected=suspected)

    async def _scan_running(self) -> _Running:
        found = _Running()
        after: tuple[datetime, UUID] | None = None
        ttl = timedelta(seconds=self.config.heartbeat_ttl_sec)
        grace = timedelta(seconds=self.config.timeout_grace_sec)
        for _ in range(_MAX_RUNNING_PAGES):
            rows = await self.executions.running_executions(after, self.config.batch_size)
            for row in rows:
                found.rows[row["id"]] = row
                age = row["db_now"] - row["started_at"]
                timeout = row["timeout_sec"]
                if timeout and age > timedelta(seconds=timeout) + grace:
                    found.timed_out.append(
                        self._ended(
                            row,
                            "TIMED_OUT",
                            f"TimeoutError: the attempt ran past timeoutSec={timeout} and its worker "
                            f"({row['worker_id']}) did not end it",
                        )
                    )
                elif age > ttl:
                    found.to_check.append(row)
            if len(rows) < self.config.batch_size:
                break
            after = (rows[-1]["created_at"], rows[-1]["id"])
        return found

    async def _lost(self, rows: Sequence[Record]) -> tuple[list[LostAttempt], int]:
        """Of RUNNING attempts old enough to have a liveness key, those whose key has stayed missing long enough."""
        if self.redis is None:
            return [], 0
        seen = {(row["id"], row["attempt"]) for row in rows}
        # Forget attempts that ended some other way (or that we no longer look at).
        for key in [k for k in self._missing_since if k not in seen]:
            del self._missing_since[key]
        if not rows:
            return [], 0
        try:
            values: list[Any] = []
            for i in range(0, len(rows), 1000):
                values += await self.redis.mget([heartbeat_key(row["id"]) for row in rows[i : i + 1000]])
        except REDIS_ERRORS as exc:
            # Without Redis nothing can be told about liveness: never declare a worker lost on that.
            log.warning("could not read liveness keys (%s); lost workers are looked for next pass", exc)
            return [], 0
        now = self.clock.monotonic()
        lost: list[LostAttempt] = []
        suspected = 0
        for row, value in zip(rows, values, strict=True):
            key = (row["id"], row["attempt"])
            holder = value.decode() if isinstance(value, bytes) else value
            if holder == row["worker_id"]:
                self._missing_since.pop(key, None)
                continue
            first = self._missing_since.setdefault(key, now)
            if first == now:
                suspected += 1
            if now - first >= self.config.lost_confirm_sec:
                lost.append(
                    self._ended(
                        row,
                        "FAILED_WORKER_LOST",
                        f"WorkerLost: worker {row['worker_id']} stopped renewing its heartbeat",
                    )
                )
        return lost, suspected

    async def _schedule_retries(self, ended: Sequence[Finished]) -> None:
        """Put the retries just scheduled into their shards' hot windows (best effort: the hydrator's overdue
        scan re-adds any that is missing)."""
        if self.hot_window is None:
            return
        horizon = self.clock.now() + timedelta(seconds=self.config.hot_window_sec)
        try:
            await self.hot_window.add_retries_due(ended, horizon)
        except REDIS_ERRORS as exc:
            log.warning("could not add retries to the hot window (the hydrator will): %s", exc)

    @staticmethod
    def _ended(row: Record, state: str, error: str) -> LostAttempt:
        policy = RetryPolicy.from_json(row["retry_policy"])
        return LostAttempt(
            execution_id=row["id"],
            attempt=row["attempt"],
            worker_id=row["worker_id"],
            state=state,
            error=error,
            retry_delay_ms=policy.delay_ms(row["attempt"]),
        )


def _trace_recovery(row: Record, ended: Finished, started_ns: int) -> None:
    """The sweeper's end of a lost or timed-out attempt, in the execution's trace: always an error span."""
    reason = "worker lost" if ended.attempt_state == "FAILED_WORKER_LOST" else "timed out"
    with tracer.start_as_current_span(
        f"sweep {reason}",
        context=execution_context(row["traceparent"]),
        start_time=started_ns,
        attributes={
            **execution_attributes(
                tenant=row["tenant_id"], job_id=row["job_id"], execution_id=row["id"], attempt=ended.attempt
            ),
            "sundial.worker_id": row["worker_id"],
            FAILURE: True,
            "sundial.attempt_state": ended.attempt_state,
            "sundial.state": ended.state,
        },
    ) as span:
        span.set_status(Status(StatusCode.ERROR, f"attempt {ended.attempt} {ended.attempt_state}; now {ended.state}"))
        if ended.next_attempt_at is not None:
            span.set_attribute("sundial.next_attempt_at", ended.next_attempt_at.isoformat())
