"""``POST /v1/worker/pull``: take a pool's messages for a caller and start their executions for it.

A pull waits on its feed (:mod:`sundial_gateway.feeds`) until ``waitMs`` for messages due now (the feed holds those
published ahead until their due instant), decodes them, skips what is not this token's (markers, undecodable
messages, another pool's or another tenant's: never opened), and claims the rest with the direct worker's
compare-and-swap (PENDING → RUNNING) under the caller's worker identity (:func:`sundial_gateway.leases.worker_id`) —
gathered with concurrent pulls' claims into one ``executions.start_executions_as`` (:mod:`sundial_gateway.gather`).
A lost claim (a duplicate, an attempt no longer current) is skipped. A won execution's liveness key is set (the
caller's heartbeats renew it; a caller that stops calling loses it to the sweeper like a direct worker), its payload
decrypted, and its attempt token issued; the feed then commits past the batch. A won execution whose row belongs to
another tenant (a forged message) ends FAILED at once, never handed out. If everything of a batch was skipped or
lost and the wait is not over, the pull takes again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import orjson
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message
from opentelemetry import trace
from redis.asyncio import Redis
from sundial_common.broker.messages import ExecutionMessage
from sundial_common.domain.ids import parse_id
from sundial_common.domain.retry_policy import RetryPolicy
from sundial_common.hotwindow.execution_signals import RENEW_LIVENESS_SCRIPT, heartbeat_key
from sundial_common.security.auth import SymmetricKey
from sundial_common.security.encryption import PAYLOAD, PROGRESS, DecryptionError, Keyring
from sundial_common.security.pool_tokens import PoolGrant
from sundial_common.stores.executions import ExecutionStore, Outcome
from sundial_common.stores.types import Record

from sundial_gateway import leases, telemetry
from sundial_gateway.feeds import Feed, feed_group
from sundial_gateway.gather import StartGather
from sundial_gateway.hooks import PauseHook

log = logging.getLogger("sundial.gateway")


@dataclass(frozen=True, slots=True)
class PullConfig:
    bootstrap: str
    client_id: str
    session_timeout_sec: float
    leave_after_sec: float
    heartbeat_ttl_sec: float


class Pulls:
    """The gateway's feeds, and the start of their executions for callers."""

    def __init__(
        self,
        config: PullConfig,
        executions: ExecutionStore,
        redis: Redis,
        keyring: Keyring,
        signing_key: SymmetricKey,
        hook: PauseHook | None = None,
    ) -> None:
        self.config = config
        self._hook = hook if hook is not None else PauseHook()
        self._executions = executions
        self._redis = redis
        self._renew = redis.register_script(RENEW_LIVENESS_SCRIPT)
        self._keyring = keyring
        self._key = signing_key
        self._feeds: dict[str, Feed] = {}
        self._starts = StartGather(executions)

    def feeds(self) -> list[Feed]:
        return list(self._feeds.values())

    def _feed(self, grant: PoolGrant, shared: bool) -> Feed:
        group = feed_group(grant.pool, grant.tenant, shared=shared)
        feed = self._feeds.get(group)
        if feed is None:
            feed = self._feeds[group] = Feed(
                self.config.bootstrap,
                grant.pool,
                group,
                client_id=self.config.client_id,
                session_timeout_sec=self.config.session_timeout_sec,
                due_of=_due_of,
            )
        return feed

    async def pull(
        self, grant: PoolGrant, shared: bool, session: str, most: int, wait_sec: float
    ) -> list[dict[str, Any]]:
        """Executions started for ``session``: at most ``most``, waiting up to ``wait_sec`` for a first one."""
        worker = leases.worker_id(grant, session)
        feed = self._feed(grant, shared)
        ends_at = time.monotonic() + wait_sec
        feed.waiting += 1
        feed.touch()
        try:
            while True:
                # The feed is held for the take only: the start runs beside other pulls' takes and starts.
                try:
                    if feed.lock.locked():  # (wait_for with no time left fails even a free lock)
                        await asyncio.wait_for(feed.lock.acquire(), max(0.0, ends_at - time.monotonic()))
                    else:
                        await feed.lock.acquire()
                except TimeoutError:
                    return []  # other callers' takes held the feed for the whole wait
                try:
                    messages = await feed.take(most, lambda: ends_at)
                finally:
                    feed.lock.release()
                try:
                    if messages:
                        await self._hook.reach("pull")
                    started = await self._start(grant, worker, messages) if messages else []
                except BaseException:
                    feed.forget(messages)
                    raise
                await feed.commit(messages)
                if started or time.monotonic() >= ends_at:
                    return started
        finally:
            feed.waiting -= 1
            feed.touch()

    def touch(self, grant: PoolGrant, shared: bool) -> None:
        """A caller of ``grant``'s pool is alive (it heartbeats) though it does not pull now (its slots are busy):
        its feed, if this gateway has one, stays in the group as a busy direct worker keeps its partitions."""
        feed = self._feeds.get(feed_group(grant.pool, grant.tenant, shared=shared))
        if feed is not None:
            feed.touch()

    async def leave_idle(self) -> None:
        """The janitor's pass: every feed no pull waited on for ``leave_after_sec`` leaves its group."""
        for feed in self.feeds():
            await feed.leave_if_idle(self.config.leave_after_sec)

    async def close(self) -> None:
        for feed in self.feeds():
            await feed.close()

    # --- starting -------------------------------------------------------------------------

    def _claims(
        self, grant: PoolGrant, messages: list[Message]
    ) -> dict[tuple[UUID, int], tuple[ExecutionMessage, Message]]:
        claims: dict[tuple[UUID, int], tuple[ExecutionMessage, Message]] = {}
        for delivery in messages:
            value = delivery.value()
            if value is None:
                continue  # the sweeper's marker: nothing to run
            try:
                message = ExecutionMessage.decode(value)
                key = (parse_id(message.execution_id), message.attempt)
            except (ValueError, TypeError, orjson.JSONDecodeError) as exc:
                log.error("skipping undecodable message %s@%s: %s", delivery.partition(), delivery.offset(), exc)
                continue
            if message.pool != grant.pool or message.tenant_id != grant.tenant:
                continue  # another tenant's work in a shared pool (or misrouted): not this token's to see
            claims.setdefault(key, (message, delivery))
        return claims

    async def _start(self, grant: PoolGrant, worker: str, messages: list[Message]) -> list[dict[str, Any]]:
        claims = self._claims(grant, messages)
        if not claims:
            return []
        cipher = await self._keyring.cipher(grant.tenant)
        rows = await self._starts.start(
            worker, list(claims), [_published_at(delivery) for _, delivery in claims.values()]
        )
        won = [row for row in rows if (row["id"], row["attempt"]) in claims]
        if not won:
            return []
        # Renewed before anything is handed out: from here the sweeper sees these attempts alive.
        ttl_ms = int(self.config.heartbeat_ttl_sec * 1000)
        await self._renew(keys=[heartbeat_key(row["id"]) for row in won], args=[worker, ttl_ms])
        leased: list[dict[str, Any]] = []
        refused: list[Outcome] = []
        request = trace.get_current_span()
        for row in won:
            message, delivery = claims[(row["id"], row["attempt"])]
            if row["tenant_id"] != grant.tenant:
                log.warning(
                    "refusing execution %s of tenant %s: pool token %s takes tenant %s's work",
                    row["id"],
                    row["tenant_id"],
                    grant.token_id,
                    grant.tenant,
                )
                error = f"PoolRefused: pool {grant.pool}'s gateway workers do not take tenant {row['tenant_id']}'s work"
                theirs = await self._keyring.cipher(row["tenant_id"])
                refused.append(Outcome(row["id"], row["attempt"], "FAILED", None, theirs.seal_error(error)))
                continue
            try:
                payload = cipher.open_json(message.payload, PAYLOAD)
            except DecryptionError as exc:  # tampered with, or another tenant's: never handed out
                sealed = cipher.seal_error(f"DecryptionError: {exc}")
                refused.append(Outcome(row["id"], row["attempt"], "FAILED", None, sealed))
                continue
            lease = self._lease(worker, row, message, payload, cipher.open_json(row.get("previous_progress"), PROGRESS))
            parent = telemetry.message_traceparent(message, delivery)
            lease["traceparent"] = telemetry.lease_traceparent(
                request, delivery.topic() or "", worker, row, message, parent
            )
            leased.append(lease)
        if refused:
            await self._executions.finish_attempts(worker, refused)
        return leased

    def _lease(
        self, worker: str, row: Record, message: ExecutionMessage, payload: Any, previous: Any
    ) -> dict[str, Any]:
        started: datetime = row["started_at"]
        timeout = message.timeout_sec if message.timeout_sec and message.timeout_sec > 0 else None
        deadline = started + timedelta(seconds=timeout) if timeout else None
        delay = RetryPolicy.from_json(row.get("retry_policy")).delay_ms(row["attempt"])
        terms = leases.Terms(int(deadline.timestamp() * 1000) if deadline else 0, delay)
        execution_id = str(row["id"])
        return {
            "executionId": execution_id,
            "jobId": str(row["job_id"]),
            "tenant": row["tenant_id"],
            "handler": message.handler,
            "attempt": row["attempt"],
            "attemptToken": leases.issue(self._key, execution_id, row["attempt"], worker, terms),
            "payload": payload,
            "scheduledFor": row["scheduled_for"],
            "timeoutSec": timeout,
            "deadline": deadline,
            "previousProgress": previous,
            "traceId": row.get("trace_id"),
        }


def _published_at(delivery: Message) -> datetime | None:
    kind, ms = delivery.timestamp()
    return None if kind == TIMESTAMP_NOT_AVAILABLE else datetime.fromtimestamp(ms / 1000, UTC)


def _due_of(delivery: Message) -> float | None:
    """The due instant of a message published ahead of it (epoch seconds); None: due now, or not a message this
    gateway can read (its pull skips it)."""
    value = delivery.value()
    if value is None:
        return None
    try:
        due_at = ExecutionMessage.decode(value).due_at
        return None if due_at is None else datetime.fromisoformat(due_at).timestamp()
    except (ValueError, TypeError, orjson.JSONDecodeError):
        return None
