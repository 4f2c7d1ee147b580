"""Writing outcomes: batched compare-and-swaps that record attempts and schedule their retries.

Handlers hand their :class:`~sundial_common.stores.executions.Outcome` to the
:class:`~sundial_worker.inflight.OutcomeBuffer`; the :class:`OutcomeFlusher` (loop ``flush``) writes it
with ONE ``executions.finish_attempts`` per pass — when ``flush_max_outcomes`` are waiting, or
``flush_interval_sec`` after the first. Only then are the messages acknowledged to the consumer (so the
offset committer may pass them) and the executions' liveness keys dropped. An outcome that lost its
compare-and-swap (the sweeper or a cancel changed the execution first) is a rejected late write: logged,
acknowledged, not retried.

An accepted attempt (:class:`~sundial_worker.verdicts.Accepted`) has nothing to write: its message is acknowledged
and its liveness key held for the time the handler asked, for whoever finishes it.

A FAILED or TIMED_OUT attempt carries its retry policy's backoff: Postgres schedules the next attempt (or
makes the execution DEAD after the last) in the same compare-and-swap, and after the write the flusher puts
the retry's member into its shard's hot window (best effort: the hydrator re-adds one that is missing).

A write that fails on a transient database error is retried with a growing backoff, the batch still
in the buffer. When the runtime stops, :meth:`OutcomeFlusher.drain` makes the loop write everything
left without waiting for company and then return.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, Status, StatusCode
from sundial_common.hotwindow.window import HotWindow
from sundial_common.observability.metrics import AttemptsEnded
from sundial_common.observability.tracing import FAILURE, tracer
from sundial_common.stores.executions import ExecutionStore, Finished

from sundial_worker.consumer import ExecutionConsumer
from sundial_worker.errors import REDIS_ERRORS, TRANSIENT_DB_ERRORS, check_positive_int, check_seconds
from sundial_worker.heartbeats import Heartbeats
from sundial_worker.inflight import FinishedAttempt, InFlight, OutcomeBuffer, WorkerStats

log = logging.getLogger("sundial.worker")

_BACKOFF_MAX_SEC = 5.0
# Retries due a little past the hot window go in too: the hydrator's watermark may already have passed
# them (the API and the dispatcher use the same margin for jobs).
_HOT_WINDOW_MARGIN = timedelta(seconds=60)


@dataclass(frozen=True, slots=True)
class FlushConfig:
    """How outcomes are batched. Validated at construction."""

    flush_max_outcomes: int = 256
    """Most outcomes written by one ``finish_attempts`` (a full buffer is written at once)."""
    flush_interval_sec: float = 0.1
    """How long the first outcome of a flush waits for company. No start waits for it, nor the recorded end (the
    worker's instant of it): only the outcome's visibility, the message's acknowledgement and a retry's hand-over
    to the hot window. A spread stream of 333/s on two workers: about 23 outcomes a finish statement."""
    hot_window_sec: int = 3600
    """Retries due within this horizon (plus a minute) go straight into the hot window (SUNDIAL_HOT_WINDOW_SEC)."""

    def __post_init__(self) -> None:
        check_positive_int(self, "flush_max_outcomes", "hot_window_sec")
        check_seconds(self, "flush_interval_sec", zero_ok=True)


@dataclass(frozen=True, slots=True)
class FlushResult:
    written: int = 0
    rejected: int = 0


class OutcomeFlusher:
    """Writes the outcome buffer to Postgres in batches, then acknowledges, releases and schedules retries."""

    def __init__(
        self,
        executions: ExecutionStore,
        worker_id: str,
        config: FlushConfig,
        *,
        outcomes: OutcomeBuffer,
        inflight: InFlight,
        consumer: ExecutionConsumer,
        heartbeats: Heartbeats,
        hot_window: HotWindow,
        stats: WorkerStats,
    ) -> None:
        self.config = config
        self.worker_id = worker_id
        self._executions = executions
        self._outcomes = outcomes
        self._inflight = inflight
        self._consumer = consumer
        self._heartbeats = heartbeats
        self._hot_window = hot_window
        self._stats = stats
        self._draining = False
        self._ended = AttemptsEnded()

    def drain(self) -> None:
        """Write what is left without waiting for company, then let :meth:`run` return."""
        self._draining = True
        self._outcomes.ready.set()
        self._outcomes.full.set()

    async def run(self) -> None:
        backoff = 0.05
        buffer = self._outcomes
        while True:
            if not buffer.items:
                if self._draining:
                    return
                buffer.ready.clear()
                await buffer.ready.wait()
                continue
            if len(buffer.items) < self.config.flush_max_outcomes and not self._draining:
                # Give the first outcome a few milliseconds of company: one write for many.
                buffer.full.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(buffer.full.wait(), self.config.flush_interval_sec)
            try:
                await self.run_once()
                backoff = 0.05
            except TRANSIENT_DB_ERRORS as exc:
                log.error("writing %d outcomes failed, retrying in %.2fs: %s", len(buffer.items), backoff, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX_SEC)

    async def run_once(self) -> FlushResult:
        """Write up to ``flush_max_outcomes`` finished outcomes in one statement, then acknowledge them."""
        buffer = self._outcomes.items
        if not buffer:
            return FlushResult()
        batch = buffer[: self.config.flush_max_outcomes]
        # Accepted attempts (verdicts.Accepted) are not over: nothing to write, their liveness is held instead.
        held = [f for f in batch if f.hold_sec is not None]
        started_ns = time.time_ns()
        written = await self._executions.finish_attempts(
            self.worker_id, [f.outcome for f in batch if f.hold_sec is None] if held else [f.outcome for f in batch]
        )
        ended_ns = time.time_ns()
        # Only now is the batch out of the buffer: a failed write above leaves it to be retried.
        del buffer[: len(batch)]
        accepted = {f.execution_id: f for f in written}
        refused = [f.outcome for f in batch if f.outcome.execution_id not in accepted and f.hold_sec is None]
        # Rare: a refused write is either this worker's own, written again after a lost acknowledgement, or lost.
        mine = await self._executions.attempts_ended_by(self.worker_id, refused) if refused else {}
        rejected = 0
        # Asked once per batch, not by each attempt's logger adapter.
        debug = batch[0].logger.isEnabledFor(logging.DEBUG)
        for finished in batch:
            if finished.hold_sec is not None:
                self._inflight.settle(finished.outcome.execution_id)
                for delivery in finished.deliveries:
                    self._consumer.ack(delivery)
                continue
            if (record := accepted.get(finished.outcome.execution_id)) is not None:
                if record.next_attempt_at is not None:
                    self._stats.retries_scheduled += 1
                    finished.logger.info(
                        "attempt %d %s; next attempt at %s",
                        record.attempt,
                        record.attempt_state,
                        record.next_attempt_at.isoformat(),
                    )
                elif record.state == "DEAD":
                    self._stats.dead += 1
                    finished.logger.warning(
                        "attempt %d %s; no attempts left: DEAD", record.attempt, record.attempt_state
                    )
            if (recorded := mine.get(finished.outcome.execution_id)) is not None:
                finished.logger.info(
                    "%s was already recorded by this worker (a write repeated after a lost reply)", recorded
                )
            elif finished.outcome.execution_id not in accepted:
                rejected += 1
                finished.logger.warning(
                    "late write rejected: %s was not recorded, another actor changed the execution first",
                    finished.outcome.state,
                )
            elif debug:
                finished.logger.debug("execution finished: %s", finished.outcome.state)
            _trace_write(finished, accepted.get(finished.outcome.execution_id), started_ns, ended_ns)
            self._inflight.settle(finished.outcome.execution_id)
            for delivery in finished.deliveries:
                self._consumer.ack(delivery)
        self._stats.flushes += 1
        self._stats.rejected += rejected
        self._ended.record((f.tenant_id, f.pool, f.state, f.next_attempt_at is not None) for f in written)
        await self._heartbeats.release([f.outcome.execution_id for f in batch if f.hold_sec is None])
        for finished in held:
            assert finished.hold_sec is not None
            await self._heartbeats.hold(finished.outcome.execution_id, finished.hold_sec)
        await self._schedule_retries(written)
        return FlushResult(written=len(batch) - len(held) - rejected, rejected=rejected)

    async def _schedule_retries(self, written: Sequence[Finished]) -> None:
        """Put the retries just scheduled into their shards' hot windows, if they are due within it.

        Best effort: Postgres has the retry, and the hydrator promotes it (or re-adds it once overdue).
        """
        horizon = datetime.now(UTC) + timedelta(seconds=self.config.hot_window_sec) + _HOT_WINDOW_MARGIN
        try:
            await self._hot_window.add_retries_due(written, horizon)
        except REDIS_ERRORS as exc:
            log.warning("could not add %d retries to the hot window (the hydrator will): %s", len(written), exc)


def _trace_write(finished: FinishedAttempt, record: Finished | None, started_ns: int, ended_ns: int) -> None:
    """The outcome write as a child of the attempt's process span (the batch's one statement, timed once)."""
    parent = finished.span_context
    outcome = finished.outcome
    failed = outcome.state in ("FAILED", "TIMED_OUT")
    # An unsampled trace still gets this span when the attempt failed (telemetry.KeepFailures).
    if parent is None or not (parent.trace_flags.sampled or failed):
        return
    attributes: dict[str, str | int | bool] = {
        "db.system.name": "postgresql",
        "db.operation.name": "finish_attempts",
        "sundial.execution_id": str(outcome.execution_id),
        "sundial.attempt": outcome.attempt,
        "sundial.outcome": outcome.state,
    }
    if failed:
        attributes[FAILURE] = True
        attributes["sundial.error"] = outcome.error or outcome.state
    span = tracer.start_span(
        "record outcome",
        context=trace.set_span_in_context(NonRecordingSpan(parent)),
        start_time=started_ns,
        attributes=attributes,
    )
    if failed:
        span.set_status(Status(StatusCode.ERROR, outcome.error or outcome.state))
    if record is None:
        span.set_attribute("sundial.rejected", True)  # another actor (sweeper, cancel) changed it first
    else:
        span.set_attribute("sundial.state", record.state)
        if record.next_attempt_at is not None:
            span.set_attribute("sundial.next_attempt_at", record.next_attempt_at.isoformat())
        if record.state == "DEAD":
            span.set_status(Status(StatusCode.ERROR, "DEAD: no attempts left"))
    span.end(end_time=ended_ns)
