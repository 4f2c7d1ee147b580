"""The retry circuit breaker's clock: one pass judges every handler's window and moves its breaker.

The active sweeper runs this loop (``breakers``) beside its sweep. Each pass:

1. reads the window counts (``breaker_counts``, written by a trigger on every finished attempt) and every
   breaker, and creates a CLOSED breaker for each handler seen for the first time (counting from the window's
   start: what ended before its row existed is judged too);
2. **CLOSED → OPEN** when the failures among the window's finished attempts (since the last close, at most
   ``windowSec`` back) reach ``failureRatio`` of at least ``minAttempts`` attempts. The dispatcher's leaders
   then hold that handler's retries (:func:`sundial_common.stores.breakers.gate_retries`);
3. **OPEN → HALF_OPEN** once its cool-down has passed: the first ``probes`` retries that come due are
   dispatched as probes;
4. half-open, the attempts that ended since are judged by their failure *rate*, as resilience4j judges its
   permitted calls: **HALF_OPEN → CLOSED** when ``probes`` of them ended with a failure ratio below
   ``failureRatio`` — a flaky handler that fails a fair share of its calls, but less than the threshold, is not
   held like a dead one — and the held retries are released at random over ``releaseSpreadSec`` (no thundering
   herd) into their shards' hot windows. **HALF_OPEN → OPEN** as soon as the failures reach ``failureRatio`` of
   ``probes`` (the ratio can no longer end below it), with the cool-down doubled up to ``maxCooldownSec``. With
   nothing more held to probe with, what did end decides. A half-open breaker whose probes brought no verdict by
   their deadline (one cool-down) lets new probes through;
5. a breaker of a tenant that turned its breaker off closes (and releases what it held); a breaker an
   operator opened (``POST /v1/breakers/{id}:open``) stays open until an operator closes it; a CLOSED breaker
   that still holds retries (closed by an operator, or by a sweeper that stopped before releasing) releases
   them on the next pass.

Each transition also writes the tenant's ``maxHoldSec`` on the breaker, where the dispatcher's retry gate reads
it: a retry held longer than that ends without running (``BreakerHeld``, DEAD after the last attempt), so a
handler that stays broken fills the dead-letter queue within ``maxHoldSec`` plus its backoff.

Breaker state is data, like a job: it survives a restart of the stack (``make down``/``make up``) because a
handler that was failing before the restart is, as far as anyone knows, failing still — forgetting it would send
every held retry at once into a downstream that may still be down. ``sundial breakers list`` and
``GET /v1/breakers`` show what is open; an operator closes a breaker with ``:close``.

Every transition is a compare-and-set on the breaker's version with its audit row in the same statement (and,
in the same transaction, its notification incident when it leaves or reaches CLOSED), so a second sweeper
(after a failover) can only lose the race, and gets a span event (``breaker.opened`` …).
The ``sundial_breaker_state`` and ``sundial_breaker_held_retries`` gauges are set from the breakers each pass.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from prometheus_client import Gauge
from redis.exceptions import RedisError
from sundial_common.hotwindow.window import HotWindow
from sundial_common.observability.metrics import BREAKER_HELD, BREAKER_STATE, Children
from sundial_common.observability.tracing import tracer
from sundial_common.stores.breakers import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    STATE_VALUES,
    Breaker,
    BreakerSettings,
    BreakerStore,
    Transition,
    WindowBucket,
)
from sundial_common.stores.types import Occurrence, RetryDue

log = logging.getLogger("sundial.breakers")


@dataclass(frozen=True, slots=True)
class BreakerLoopConfig:
    """The breaker loop's cadence and the default settings of every tenant's breakers."""

    #: Seconds between passes.
    interval_sec: float = 1.0
    #: The settings of tenants that set none of their own (each tenant may override any field).
    defaults: BreakerSettings = field(default_factory=BreakerSettings)
    #: Who the audit log names for the loop's transitions.
    actor: str = "sweeper"

    def __post_init__(self) -> None:
        if not self.interval_sec > 0:
            raise ValueError("BreakerLoopConfig.interval_sec must be > 0")


@dataclass(frozen=True, slots=True)
class BreakerPassResult:
    opened: int = 0
    half_opened: int = 0
    closed: int = 0
    released: int = 0


def record_transition(breaker: Breaker, action: str, detail: Mapping[str, Any]) -> None:
    """One span with one event per transition, so a trace backend shows when and why a breaker moved."""
    attributes: dict[str, str | int | float | bool] = {
        "sundial.tenant": breaker.tenant_id,
        "sundial.pool": breaker.pool,
        "sundial.handler": breaker.handler,
        "sundial.breaker_id": str(breaker.id),
        "sundial.breaker.state": breaker.state,
    }
    with tracer.start_as_current_span("breaker transition", attributes=attributes) as span:
        span.add_event(
            f"breaker.{action}",
            {
                **attributes,
                **{f"sundial.breaker.{k}": v for k, v in detail.items() if isinstance(v, int | float | str)},
            },
        )


class BreakerLoop:
    """Judges every handler's window and moves its breaker (see the module docstring)."""

    def __init__(
        self,
        store: BreakerStore,
        hot_window: HotWindow | None,
        config: BreakerLoopConfig,
    ) -> None:
        self.store = store
        self.hot_window = hot_window
        self.config = config
        self._state: Children[Gauge] = Children(BREAKER_STATE)
        self._held: Children[Gauge] = Children(BREAKER_HELD)
        self._pruned_at: datetime | None = None
        #: A whole pass has set the gauges since they were last forgotten: a quiet stack may skip the next ones.
        self._judged = False

    def settings_for(self, tenant_settings: Mapping[str, Mapping[str, Any]], tenant: str) -> BreakerSettings:
        try:
            return self.config.defaults.merged(tenant_settings.get(tenant))
        except (TypeError, ValueError) as exc:  # a row written around the API's validation: the defaults
            log.warning("tenant %s: breaker settings ignored (%s)", tenant, exc)
            return self.config.defaults

    async def run_once(self) -> BreakerPassResult:
        if self._judged and await self.store.quiet():
            return BreakerPassResult()  # nothing to judge, move or release: one statement, not four
        now = await self.store.now()
        tenant_settings = await self.store.tenant_settings()
        longest = max(
            [self.config.defaults.window_sec]
            + [self.settings_for(tenant_settings, t).window_sec for t in tenant_settings]
        )
        window_start = now - timedelta(seconds=longest)
        buckets = await self.store.window_counts(window_start)
        by_handler: dict[tuple[str, str, str], list[WindowBucket]] = defaultdict(list)
        for b in buckets:
            by_handler[(b.tenant_id, b.pool, b.handler)].append(b)
        breakers = await self.store.all_breakers()
        known = {(b.tenant_id, b.pool, b.handler) for b in breakers}
        if new := [h for h in by_handler if h not in known]:
            await self.store.ensure_breakers(new, window_start)
            breakers = await self.store.all_breakers()

        opened = half_opened = closed = released = 0
        windows: list[tuple[Any, int, int]] = []
        for breaker in breakers:
            settings = self.settings_for(tenant_settings, breaker.tenant_id)
            handler_buckets = by_handler.get((breaker.tenant_id, breaker.pool, breaker.handler), [])
            first = _second(breaker.since)
            start = max(now - timedelta(seconds=settings.window_sec), first)
            attempts = sum(b.attempts for b in handler_buckets if b.bucket >= start)
            failures = sum(b.failures for b in handler_buckets if b.bucket >= start)
            if start == first:  # the state's first second counts only what ended after the state began
                attempts = max(0, attempts - breaker.since_attempts)
                failures = max(0, failures - breaker.since_failures)
            move = self._decide(breaker, settings, attempts, failures)
            if move is not None and move.to_state != OPEN:
                # The new state starts counting at this pass's instant: what its second held so far is not its.
                this_second = [b for b in handler_buckets if b.bucket == _second(now)]
                move = dataclasses.replace(
                    move,
                    since=now,
                    since_attempts=sum(b.attempts for b in this_second),
                    since_failures=sum(b.failures for b in this_second),
                )
            if move is None and breaker.state == CLOSED and breaker.held:
                # Closed by an operator, or by a sweeper that stopped before releasing: let them go now.
                released += await release(self.store, self.hot_window, breaker, settings.release_spread_sec)
            if move is None:
                if (attempts, failures) != (breaker.attempts, breaker.failures):
                    windows.append((breaker.id, attempts, failures))
                self._gauge(breaker)
                continue
            moved = await self.store.transition(move)
            if moved is None:  # another sweeper or an operator moved it first
                continue
            self._gauge(moved)
            record_transition(moved, move.action, move.detail)
            log.warning(
                "breaker %s/%s/%s %s → %s (%d of %d attempts failed; held %d)",
                moved.tenant_id,
                moved.pool,
                moved.handler,
                breaker.state,
                moved.state,
                failures,
                attempts,
                moved.held,
            )
            if moved.state == OPEN:
                opened += 1
            elif moved.state == HALF_OPEN:
                half_opened += 1
            else:
                closed += 1
                released += await release(self.store, self.hot_window, moved, settings.release_spread_sec)
        await self.store.record_window(windows)
        self._state.forget((b.tenant_id, b.pool, b.handler) for b in breakers)
        self._held.forget((b.tenant_id, b.pool, b.handler) for b in breakers)
        if self._pruned_at is None or now - self._pruned_at > timedelta(seconds=60):
            # Only the longest window in use is kept: the table stays a few minutes of buckets, which the
            # per-pass read scans whole.
            await self.store.prune_counts(now - timedelta(seconds=longest + 60))
            self._pruned_at = now
        self._judged = True
        return BreakerPassResult(opened=opened, half_opened=half_opened, closed=closed, released=released)

    def _decide(self, b: Breaker, s: BreakerSettings, attempts: int, failures: int) -> Transition | None:
        actor = self.config.actor
        if b.manual:
            return None
        if not s.enabled:
            if b.state == CLOSED:
                return None
            return Transition(b, CLOSED, "closed", actor, attempts=attempts, failures=failures, detail={"why": "off"})
        if b.state == CLOSED:
            if attempts >= s.min_attempts and failures >= s.failure_ratio * attempts:
                return Transition(
                    b,
                    OPEN,
                    "opened",
                    actor,
                    next_probe_in_sec=s.cooldown_sec,
                    cooldown_sec=s.cooldown_sec,
                    attempts=attempts,
                    failures=failures,
                    detail={"attempts": attempts, "failures": failures, "cooldownSec": s.cooldown_sec},
                    max_hold_sec=s.max_hold_sec,
                )
            return None
        if b.state == OPEN:
            return _half_open(b, s, actor, "half_opened") if b.probe_due else None
        # HALF_OPEN: the failure rate of what ended since it went half-open decides.
        limit = max(b.probe_limit, 1)
        settled = attempts >= limit or (b.held == 0 and (attempts > 0 or b.probe_due))
        if failures > 0 and (
            failures >= s.failure_ratio * limit or (settled and failures >= s.failure_ratio * attempts)
        ):
            cooldown = min(max(b.cooldown_sec, s.cooldown_sec) * 2, s.max_cooldown_sec)
            return Transition(
                b,
                OPEN,
                "reopened",
                actor,
                next_probe_in_sec=cooldown,
                cooldown_sec=cooldown,
                attempts=attempts,
                failures=failures,
                detail={"attempts": attempts, "failures": failures, "cooldownSec": cooldown},
                max_hold_sec=s.max_hold_sec,
            )
        # Enough calls ended below the threshold — or fewer, when nothing more is held to probe with (else a handler
        # with one held retry would stay half-open for ever).
        if settled:
            return Transition(
                b,
                CLOSED,
                "closed",
                actor,
                detail={"probes": attempts, "probesFailed": failures, "held": b.held},
                max_hold_sec=s.max_hold_sec,
            )
        if b.probe_due:  # the probes brought no verdict in time (lost, or nothing to retry): send new ones
            return _half_open(b, s, actor, "probes_renewed")
        return None

    def _gauge(self, b: Breaker) -> None:
        self._state(b.tenant_id, b.pool, b.handler).set(STATE_VALUES[b.state])
        self._held(b.tenant_id, b.pool, b.handler).set(b.held)

    def forget_gauges(self) -> None:
        """A sweeper that stopped leading must not report stale states beside the new leader's."""
        self._state.forget()
        self._held.forget()
        self._judged = False


def _half_open(b: Breaker, s: BreakerSettings, actor: str, event: str) -> Transition:
    """Let ``s.probes`` retries through, and judge them before the next probe time."""
    return Transition(
        b,
        HALF_OPEN,
        event,
        actor,
        next_probe_in_sec=max(b.cooldown_sec, s.cooldown_sec),
        cooldown_sec=b.cooldown_sec,
        probe_limit=s.probes,
        detail={"probes": s.probes},
        max_hold_sec=s.max_hold_sec,
    )


def _second(at: datetime) -> datetime:
    return at.replace(microsecond=0)


async def release(store: BreakerStore, hot_window: HotWindow | None, breaker: Breaker, spread_sec: float) -> int:
    """Release ``breaker``'s held retries and first fires; how many."""
    retries = await store.release_held(breaker.id, spread_sec)
    fires = await store.release_first_fires(breaker, spread_sec)
    if hot_window is not None and (retries or fires):
        by_shard: dict[int, list[RetryDue]] = defaultdict(list)
        for r in retries:
            by_shard[r.shard].append(RetryDue(r.execution_id, r.next_attempt_at))
        jobs_by_shard: dict[int, list[Occurrence]] = defaultdict(list)
        for f in fires:
            jobs_by_shard[f.shard].append(Occurrence(f.execution_id, f.next_attempt_at))
        try:
            for shard, due in by_shard.items():
                await hot_window.add_retries(shard, due)
            for shard, occurrences in jobs_by_shard.items():
                await hot_window.add(shard, occurrences)
        except (RedisError, OSError) as exc:
            log.warning("released work not put into the hot window (the hydrator will): %r", exc)
    if retries or fires:
        log.info(
            "breaker %s/%s/%s released %d held retries and %d held first fires over %.0fs",
            breaker.tenant_id,
            breaker.pool,
            breaker.handler,
            len(retries),
            len(fires),
            spread_sec,
        )
    return len(retries) + len(fires)
