"""``POST /v1/worker/heartbeat`` and ``/finish``: a caller's running attempts, renewed and ended.

Every execution named must come with its attempt token, checked (in constant time) for this execution, attempt and
caller (:mod:`sundial_gateway.leases`); any gateway replica can check it, so a worker whose gateway died carries on
with another.

**Heartbeat.** Renews the liveness keys of the valid ones in ONE Redis call — only a key still the caller's (the
sweeper may have given the execution to another worker since); a missing key is looked up in Postgres: an attempt
this caller already finished is answered ``renewed: false`` (stop: it has ended), any other has its key set again
(Redis lost it) — stores the progress sent with any
of them (sealed, on the attempt: ``previousProgress`` of a retry), and answers which to stop: a cancel requested
(its Redis flag, or Postgres when the flag is lost), or a deadline passed. One that is no longer the caller's is
answered ``renewed: false``: stop it, its finish would be rejected.

**Finish.** Seals result, error, traceback and log tail with the tenant's key and writes them with ONE
``executions.finish_attempts_as``, gathered with the finishes of other calls that arrive within a few ms
(:mod:`sundial_gateway.gather`) — the direct worker's compare-and-swap: an attempt that is not RUNNING under this
caller any more (a stale attempt token, a cancel, the sweeper) is rejected, so at most one completion per execution
is accepted. A FAILED or TIMED_OUT attempt schedules its retry with the backoff drawn when it started; a finish that
comes more than ``timeout_grace_sec`` past the deadline is recorded TIMED_OUT whatever it says. A finish repeated
after a lost answer (the caller retried with another gateway) is answered accepted, as recorded the first time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar
from uuid import UUID

import orjson
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sundial_common.hotwindow.execution_signals import (
    KEEP_LIVENESS_SCRIPT,
    RELEASE_LIVENESS_SCRIPT,
    cancel_key,
    heartbeat_key,
)
from sundial_common.hotwindow.window import HotWindow
from sundial_common.security.auth import SymmetricKey
from sundial_common.security.encryption import LOG_TAIL, PROGRESS, RESULT, TRACEBACK, Keyring
from sundial_common.security.pool_tokens import PoolGrant
from sundial_common.stores.executions import ExecutionStore, Finished, Outcome
from sundial_common.stores.types import RetryDue

from sundial_gateway import leases
from sundial_gateway.gather import FinishGather
from sundial_gateway.models import FinishRequest, HeartbeatRequest

log = logging.getLogger("sundial.gateway")

# Per liveness key: 1 — the caller's, renewed; 0 — missing (left unset: an ended attempt must not come back alive);
# -1 — another worker's (the sweeper gave the execution to it).
_HOLD_SCRIPT = """
local marks = {}
for i = 1, #KEYS do
  local holder = redis.call('GET', KEYS[i])
  if holder == ARGV[1] then
    redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
    marks[i] = 1
  elseif holder == false then
    marks[i] = 0
  else
    marks[i] = -1
  end
end
return marks
"""

# Retries due a little past the hot window go in too (the hydrator's watermark may have passed them).
_HOT_WINDOW_MARGIN = timedelta(seconds=60)


class _Attempt(Protocol):
    """What every item of a heartbeat or a finish names: an attempt and its token."""

    @property
    def execution_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def attempt_token(self) -> str: ...


_A = TypeVar("_A", bound=_Attempt)


class TooLarge(ValueError):
    """A field over its cap: ``field`` names it as the request wrote it."""

    def __init__(self, field: str, size: int, cap: int) -> None:
        super().__init__(f"is {size} bytes of JSON; at most {cap} are accepted")
        self.field = field


@dataclass(frozen=True, slots=True)
class AttemptLimits:
    heartbeat_ttl_sec: float
    timeout_grace_sec: float
    max_result_bytes: int
    max_progress_bytes: int
    max_traceback_chars: int
    max_log_tail_chars: int
    hot_window_sec: int


def _size(value: Any, field: str, cap: int) -> None:
    size = len(orjson.dumps(value))
    if size > cap:
        raise TooLarge(field, size, cap)


class Attempts:
    """Heartbeats and finishes of the callers' running attempts."""

    def __init__(
        self,
        limits: AttemptLimits,
        executions: ExecutionStore,
        redis: Redis,
        keyring: Keyring,
        keys: Sequence[SymmetricKey],
    ) -> None:
        self.limits = limits
        self._executions = executions
        self._finishes = FinishGather(executions)
        self._redis = redis
        self._keep = redis.register_script(KEEP_LIVENESS_SCRIPT)
        self._hold = redis.register_script(_HOLD_SCRIPT)
        self._release = redis.register_script(RELEASE_LIVENESS_SCRIPT)
        self._hot_window = HotWindow(redis)
        self._keyring = keyring
        self._keys = tuple(keys)

    def _vet(
        self, worker: str, items: Sequence[_A], stale: Callable[[str, str], dict[str, Any]]
    ) -> tuple[dict[str, dict[str, Any]], list[tuple[_A, leases.Terms]]]:
        """The frame heartbeat and finish share: each item's attempt token checked for this caller; the answers of
        those that fail (``stale``), and the others with the terms their token carries."""
        answers: dict[str, dict[str, Any]] = {}
        vetted: list[tuple[_A, leases.Terms]] = []
        for item in items:
            terms = leases.check(self._keys, item.attempt_token, item.execution_id, item.attempt, worker)
            if terms is None:
                answers[item.execution_id] = stale(item.execution_id, "not this worker's attempt (stale token)")
            else:
                vetted.append((item, terms))
        return answers, vetted

    # --- heartbeat ---------------------------------------------------------------------------

    async def heartbeat(self, grant: PoolGrant, body: HeartbeatRequest) -> list[dict[str, Any]]:
        worker = leases.worker_id(grant, body.session)
        for i, item in enumerate(body.running):
            if item.progress is not None:
                _size(item.progress, f"running[{i}].progress", self.limits.max_progress_bytes)
        answers, vetted = self._vet(worker, body.running, lambda key, why: _beat(key, False, why))
        valid = [(UUID(item.execution_id), item.attempt, terms, item.progress) for item, terms in vetted]
        held, ended = await self._renew(worker, [(execution_id, attempt) for execution_id, attempt, *_ in valid])
        cipher = await self._keyring.cipher(grant.tenant) if any(p is not None for *_, p in valid) else None
        cancels = await self._cancels([i for i, *_ in valid if i in held])
        now_ms = time.time() * 1000
        for execution_id, attempt, terms, progress in valid:
            key = str(execution_id)
            if execution_id in ended:
                answers[key] = _beat(key, False, "the attempt has ended: its finish was recorded")
                continue
            if execution_id not in held:
                answers[key] = _beat(key, False, "the sweeper gave this execution to another worker")
                continue
            if progress is not None and cipher is not None:
                sealed = cipher.seal_json(progress, PROGRESS)
                if not await self._executions.record_progress(execution_id, attempt, worker, sealed):
                    answers[key] = _beat(key, False, "the attempt is no longer running under this worker")
                    continue
            if execution_id in cancels:
                answers[key] = _beat(key, True, "cancel requested", cancel=True)
            elif terms.deadline_ms and now_ms > terms.deadline_ms:
                answers[key] = _beat(key, True, "the attempt's deadline has passed: finish it TIMED_OUT", cancel=True)
            else:
                answers[key] = _beat(key, True, None)
        return [answers[item.execution_id] for item in body.running]

    async def _renew(self, worker: str, attempts: list[tuple[UUID, int]]) -> tuple[set[UUID], set[UUID]]:
        """Which of these attempts this worker still holds (their keys renewed), and which have ended.

        ONE Redis call renews the keys still the caller's. A missing key is either an attempt already finished
        (its key released: the caller must stop, not be told "renewed") or a Redis that lost its keys (flushed or
        restarted: the key is set again); Postgres tells them apart, for the missing ones only."""
        if not attempts:
            return set(), set()
        ids = [execution_id for execution_id, _ in attempts]
        ttl_ms = int(self.limits.heartbeat_ttl_sec * 1000)
        marks = await self._hold(keys=[heartbeat_key(i) for i in ids], args=[worker, ttl_ms])
        held = {i for i, mark in zip(ids, marks, strict=True) if int(mark) == 1}
        missing = [(i, a) for (i, a), mark in zip(attempts, marks, strict=True) if int(mark) == 0]
        if not missing:
            return held, set()
        probes = [Outcome(i, a, "RUNNING") for i, a in missing]
        ended = set(await self._executions.attempts_ended_by(worker, probes))
        back = [i for i, _ in missing if i not in ended]
        if back:
            await self._keep(keys=[heartbeat_key(i) for i in back], args=[worker, ttl_ms])
        return held | set(back), ended

    async def _cancels(self, ids: list[UUID]) -> set[UUID]:
        if not ids:
            return set()
        flagged: set[UUID] = set()
        try:
            flags = await self._redis.mget([cancel_key(i) for i in ids])
            flagged = {i for i, flag in zip(ids, flags, strict=True) if flag is not None}
        except RedisError as exc:
            log.warning("reading cancel flags failed (asking Postgres): %s", exc)
        return flagged | await self._executions.cancel_requested([i for i in ids if i not in flagged])

    # --- finish ------------------------------------------------------------------------------

    async def finish(self, grant: PoolGrant, body: FinishRequest) -> list[dict[str, Any]]:
        worker = leases.worker_id(grant, body.session)
        for i, item in enumerate(body.outcomes):
            if item.result is not None:
                _size(item.result, f"outcomes[{i}].result", self.limits.max_result_bytes)
        cipher = await self._keyring.cipher(grant.tenant)
        answers, vetted = self._vet(worker, body.outcomes, lambda key, why: _end(key, None, why))
        outcomes: list[Outcome] = []
        now_ms = time.time() * 1000
        for item, terms in vetted:
            state: str = item.state
            error = f"{item.error.type}: {item.error.message}" if item.error is not None else None
            late = terms.deadline_ms and now_ms > terms.deadline_ms + self.limits.timeout_grace_sec * 1000
            if late and state in ("SUCCEEDED", "FAILED"):
                state, error = "TIMED_OUT", "TimeoutError: finished after the attempt's deadline"
            if state in ("FAILED", "TIMED_OUT") and error is None:
                error = "TimeoutError: the attempt's deadline passed" if state == "TIMED_OUT" else "Error: failed"
            traceback = item.error.traceback if item.error is not None else None
            outcomes.append(
                Outcome(
                    UUID(item.execution_id),
                    item.attempt,
                    state,
                    cipher.seal_json(item.result, RESULT) if state == "SUCCEEDED" else None,
                    cipher.seal_error(error),
                    retry_delay_ms=terms.retry_delay_ms if state in ("FAILED", "TIMED_OUT") else 0,
                    traceback=cipher.seal_json(_tail(traceback, self.limits.max_traceback_chars), TRACEBACK),
                    log_tail=cipher.seal_json(_tail(item.log_tail, self.limits.max_log_tail_chars), LOG_TAIL),
                )
            )
        if outcomes:
            written = await self._finishes.finish(worker, outcomes)
            accepted = {f.execution_id: f for f in written}
            refused = [o for o in outcomes if o.execution_id not in accepted]
            repeated = await self._executions.attempts_ended_by(worker, refused) if refused else {}
            for outcome in outcomes:
                key = str(outcome.execution_id)
                if (record := accepted.get(outcome.execution_id)) is not None:
                    answers[key] = _end(key, record, None)
                elif (recorded := repeated.get(outcome.execution_id)) is not None:
                    answers[key] = {**_end(key, None, None), "accepted": True, "state": recorded}
                else:
                    answers[key] = _end(key, None, "rejected: the execution changed first (cancelled, or the sweeper)")
            await self._settle(worker, [o.execution_id for o in outcomes], written)
        return [answers[item.execution_id] for item in body.outcomes]

    async def _settle(self, worker: str, ids: list[UUID], written: list[Finished]) -> None:
        """Drop the liveness keys and put the retries due soon into their shards' hot windows. Best effort: Postgres
        has the outcome and the retry (the hydrator promotes it)."""
        horizon = datetime.now(UTC) + timedelta(seconds=self.limits.hot_window_sec) + _HOT_WINDOW_MARGIN
        by_shard: dict[int, list[RetryDue]] = {}
        for record in written:
            retry = record.retry
            if retry is not None and retry.due < horizon:
                by_shard.setdefault(record.shard, []).append(retry)
        try:
            await self._release(keys=[heartbeat_key(i) for i in ids], args=[worker])
            for shard, retries in by_shard.items():
                await self._hot_window.add_retries(shard, retries)
        except RedisError as exc:
            log.warning("releasing liveness keys or adding retries failed (the sweeper and hydrator will): %s", exc)


def _tail(text: str | None, cap: int) -> str | None:
    return None if not text else text[-cap:]


def _beat(execution_id: str, renewed: bool, reason: str | None, *, cancel: bool = False) -> dict[str, Any]:
    return {"executionId": execution_id, "renewed": renewed, "cancel": cancel, "reason": reason}


def _end(execution_id: str, record: Finished | None, reason: str | None) -> dict[str, Any]:
    return {
        "executionId": execution_id,
        "accepted": record is not None,
        "state": record.state if record is not None else None,
        "nextAttemptAt": record.next_attempt_at if record is not None else None,
        "reason": reason,
    }
