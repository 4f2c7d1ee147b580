"""A pool's messages for the gateway's callers: a consumer that is in the group only while some caller pulls.

One :class:`Feed` per (pool, group) this gateway serves. A pull holds the feed only while it takes messages (one
take at a time: the consumer is one), joining the consumer group if it is not in it and consuming up to ``max``
messages within its wait; the start compare-and-swap then runs outside it, so concurrent pulls of one pool start
their batches side by side. Once a batch's executions are started (or their start lost), :meth:`Feed.commit` commits
past them — but never past a message another pull took and has not decided yet (per partition, the commit stops at
the lowest offset still in flight; :meth:`Feed.forget` drops a batch whose start failed): from then on a RUNNING row
and its liveness key, renewed by the worker's heartbeats, are what keep the execution alive, as for a direct worker
whose redelivered message loses the start compare-and-swap. **No stranded work**: :meth:`Feed.leave_if_idle` (the
gateway's janitor, twice a second) closes the consumer — leaving the group, so its partitions move to members that
have callers — once no pull has waited on it for ``leave_after_sec``; a gateway with no caller holds no partition.

The group: an owned pool's gateways join the pool's own group (:func:`~sundial_common.broker.messages.pool_group`),
alongside any direct worker, so the sweeper's view of what the group has passed holds. A shared pool's token takes
one tenant's work only, so each sharing tenant's gateways form a group of their own that reads the whole topic and
skips the other tenants' messages (their payloads are never opened).

confluent-kafka blocks, and a consumer must be used from one thread: every call runs on the feed's own thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from sundial_common.broker.kafka import NO_METRICS_PUSH, ensure_topics
from sundial_common.broker.messages import pool_group, pool_topic

log = logging.getLogger("sundial.gateway")

_T = TypeVar("_T")
#: One consume call's longest wait: how often a long poll looks at its deadline.
_SLICE_SEC = 0.25


def feed_group(pool: str, tenant: str, *, shared: bool) -> str:
    """The consumer group of a pool's gateways serving ``tenant`` (see the module docstring)."""
    return f"{pool_group(pool)}.tenant.{tenant}" if shared else pool_group(pool)


class Feed:
    """One pool's consumer for one group, in the group only while pulls wait on it."""

    def __init__(
        self,
        bootstrap: str,
        pool: str,
        group: str,
        *,
        client_id: str,
        session_timeout_sec: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = pool
        self.topic = pool_topic(pool)
        self.group = group
        self.bootstrap = bootstrap
        self._clock = clock
        self._config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": client_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": int(session_timeout_sec * 1000),
            "heartbeat.interval.ms": max(100, int(session_timeout_sec * 1000) // 3),
            "fetch.wait.max.ms": 10,
            "topic.metadata.refresh.interval.ms": 10000,
            **NO_METRICS_PUSH,
        }
        #: Held by the pull taking messages (the consumer is used by one take at a time).
        self.lock = asyncio.Lock()
        #: Per partition: offsets taken by pulls whose start is not decided yet, and the end of those decided.
        self._in_flight: dict[int, set[int]] = {}
        self._decided: dict[int, int] = {}
        #: Pulls waiting for or holding :attr:`lock`.
        self.waiting = 0
        self._last_pull = clock()
        self._consumer: Consumer | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sundial-gateway-{pool}")

    @property
    def joined(self) -> bool:
        return self._consumer is not None

    def touch(self) -> None:
        self._last_pull = self._clock()

    async def take(self, most: int, wait_sec: float, deadline: Callable[[], float]) -> list[Message]:
        """Up to ``most`` messages, waiting until ``deadline()`` (monotonic) for a first one. Hold :attr:`lock`."""
        if self._consumer is None:
            await self._call(self._join)
        while True:
            remaining = deadline() - self._clock()
            messages = await self._call(self._consume, most, max(0.0, min(_SLICE_SEC, remaining)))
            if messages or remaining <= _SLICE_SEC:
                for partition, offset in _positions(messages):
                    self._in_flight.setdefault(partition, set()).add(offset)
                return messages

    async def commit(self, messages: list[Message]) -> None:
        """Commit past ``messages`` (their starts decided), up to the first message of each partition another pull
        has in flight. A failed commit is only logged: the messages come again and their start compare-and-swap
        loses."""
        ends: dict[int, int] = {}
        for partition, offset in _positions(messages):
            self._in_flight.get(partition, set()).discard(offset)
            self._decided[partition] = max(self._decided.get(partition, -1), offset + 1)
            in_flight = self._in_flight.get(partition)
            ends[partition] = min(in_flight) if in_flight else self._decided[partition]
        if ends and self._consumer is not None:
            await self._call(self._commit, ends)

    def forget(self, messages: list[Message]) -> None:
        """Drop ``messages`` from those in flight without committing past them (their start failed): a later batch's
        commit passes them, and the sweeper sends again what stays PENDING."""
        for partition, offset in _positions(messages):
            self._in_flight.get(partition, set()).discard(offset)

    async def leave_if_idle(self, leave_after_sec: float) -> bool:
        """Leave the group if no pull has waited for ``leave_after_sec``; whether it left."""
        if self._consumer is None or self.waiting or self._clock() - self._last_pull < leave_after_sec:
            return False
        async with self.lock:
            if self.waiting:
                return False
            await self._call(self._leave)
        log.info("left group %s of %s: no caller pulls", self.group, self.topic)
        return True

    async def close(self) -> None:
        try:
            await self._call(self._leave)
        finally:
            self._thread.shutdown(wait=False)

    # --- on the feed's thread ----------------------------------------------------------------

    async def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _join(self) -> None:
        ensure_topics(self.bootstrap, [self.topic])
        consumer = Consumer(self._config)
        consumer.subscribe([self.topic])
        self._consumer = consumer
        log.info("joined group %s of %s: a caller pulls", self.group, self.topic)

    def _consume(self, most: int, wait_sec: float) -> list[Message]:
        assert self._consumer is not None
        messages = self._consumer.consume(num_messages=most, timeout=wait_sec)
        out = []
        for message in messages:
            error = message.error()
            if error is None:
                out.append(message)
            elif error.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error on %s: %s", self.topic, error)
        return out

    def _commit(self, ends: dict[int, int]) -> None:
        assert self._consumer is not None
        try:
            # Not waited for: a commit that fails only makes the messages come again, to lose the start CAS.
            self._consumer.commit(
                offsets=[TopicPartition(self.topic, p, o) for p, o in ends.items()], asynchronous=True
            )
        except KafkaException as exc:
            log.warning("committing %s offsets failed (their messages come again): %s", self.topic, exc)

    def _leave(self) -> None:
        consumer, self._consumer = self._consumer, None
        self._in_flight.clear()  # a member that joins again starts from the group's committed offsets
        self._decided.clear()
        if consumer is not None:
            consumer.close()  # leaves the group: the partitions move to another member at once


def _positions(messages: list[Message]) -> list[tuple[int, int]]:
    positions = []
    for message in messages:
        partition, offset = message.partition(), message.offset()
        if partition is not None and offset is not None:
            positions.append((partition, offset))
    return positions
