"""The worker's side of Kafka: one consumer group per pool, and offsets committed only behind Postgres.

:class:`ExecutionConsumer` is the small interface the runtime depends on;
:class:`KafkaExecutionConsumer` is its confluent-kafka implementation.

Threading. confluent-kafka blocks and is not asyncio-aware, and its consumer must not be closed
while another thread is inside ``consume()``. So every call on the consumer — consume, commit,
pause, close — runs on one dedicated thread (a single-worker executor), which also makes it the
thread that runs the rebalance callbacks. The only state shared with the event loop is the
:class:`~sundial_worker.assignment.Assignment`: the assigned partitions and their offsets, behind one lock.

Back-pressure. The runtime asks for at most as many messages as it has free handler slots, so
nothing is taken from Kafka that cannot start now. When every slot is busy it calls
:meth:`keepalive` instead: that pauses the assigned partitions and still calls ``consume()``, which
is what keeps this member in the group (``max.poll.interval.ms``) and lets rebalances complete while
long handlers run.

Parking. An idle worker fetches nothing: the broker (Tansu) does not answer a parked fetch as soon as a message
arrives (measured: a message produced mid-wait arrived after ~1/4-1/8 of ``fetch.wait.max.ms``), so only short
fetch waits give low latency, and each idle one costs the broker (10 ms: ~100 fetches/s, ~0.04 of a core per
consumer). :meth:`park` pauses the assigned partitions (no fetch at all) and only serves the group (rebalance
callbacks) without waiting; the admission loop waits for a publisher's wake-up
(:mod:`sundial_worker.wakeups`) instead, then :meth:`poll` resumes. librdkafka's broker thread does not notice a
resume until its next 1 s tick (measured: ~700 ms until the first fetch), so a resume is followed by one
``ListOffsets`` request through that broker, which wakes it: the first fetch then leaves within a millisecond or two.

Commits. A message is acknowledged (:meth:`ack`) once its Postgres write is done; :meth:`commit`
commits, per partition, the end of the contiguous acknowledged prefix. When partitions are revoked,
their prefix is committed synchronously before they go, so the next owner redelivers as little as
possible; messages still running here are redelivered to it and lose the start CAS there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, KafkaException, Message, TopicPartition
from sundial_common.broker.kafka import ensure_topics, pool_consumer_config
from sundial_common.broker.messages import pool_group, pool_topic

from sundial_worker.assignment import Assignment
from sundial_worker.offsets import TopicPartitionKey

log = logging.getLogger("sundial.worker.kafka")

T = TypeVar("T")

#: A partition is parked only this long after the last assignment change (it has fetched by then).
_SETTLE_SEC = 5.0


def consumer_group(pool: str) -> str:
    """Every worker of a pool shares one group, so each message goes to one of them."""
    return pool_group(pool)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message as the consumer handed it out; :meth:`ExecutionConsumer.ack` takes it back."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    traceparent: str | None
    #: When the message reached the broker (its Kafka timestamp), if the broker said.
    published_at: datetime | None = None

    @property
    def tp(self) -> TopicPartitionKey:
        return (self.topic, self.partition)


class ExecutionConsumer(Protocol):
    """Where execution messages come from, and where the worker says it is done with them."""

    @property
    def ready(self) -> asyncio.Event:
        """Set once this member has been assigned partitions for the first time."""
        ...

    async def open(self) -> None: ...

    async def poll(self, max_messages: int, wait_sec: float) -> list[Delivery]:
        """Up to ``max_messages`` deliveries; waits at most ``wait_sec`` seconds for the first one."""
        ...

    async def keepalive(self, wait_sec: float) -> None:
        """Stay in the group without taking messages (every handler slot is busy)."""
        ...

    async def park(self, max_messages: int) -> list[Delivery]:
        """Stop fetching from the broker (idle) and serve the group without waiting; returns only what partitions
        assigned meanwhile delivered. :meth:`poll` fetches again."""
        ...

    def ack(self, delivery: Delivery) -> None:
        """The delivery needs nothing more: its offset may be committed once those before it are."""
        ...

    async def commit(self) -> int:
        """Commit what :meth:`ack` allows (asynchronously); returns how many partitions moved."""
        ...

    async def lag(self) -> dict[int, int]:
        """Per assigned partition: messages not yet taken by this consumer (high watermark minus position)."""
        ...

    async def close(self) -> None:
        """Final synchronous commit, then leave the group. Idempotent."""
        ...


class KafkaExecutionConsumer:
    """confluent-kafka consumer of one pool's topic, driven from a dedicated thread."""

    def __init__(
        self,
        bootstrap: str,
        pool: str,
        *,
        client_id: str,
        topic_partitions: int = 4,
        session_timeout_sec: float = 3.0,
        overrides: dict[str, Any] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.pool = pool
        self.topic = pool_topic(pool)
        self.group = consumer_group(pool)
        self._topic_partitions = topic_partitions
        self._config = pool_consumer_config(
            bootstrap, self.group, client_id=client_id, session_timeout_sec=session_timeout_sec, on_error=self._on_error
        )
        self._config.update(overrides or {})
        self._ready = asyncio.Event()
        self._assignment = Assignment()
        self._consumer: Consumer | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._paused = False
        #: Monotonic time of the last assignment change: a partition is parked only once it has fetched.
        self._assigned_at = 0.0
        self._closed = False
        self._fatal: KafkaError | None = None

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def ready(self) -> asyncio.Event:
        return self._ready

    def assigned(self) -> set[TopicPartitionKey]:
        """The partitions this member owns now (empty while the group gives it none)."""
        return set(self._assignment.partitions())

    async def open(self) -> None:
        if self._consumer is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sundial-kafka-{self.pool}")
        await self._call(self._open_sync)

    def _open_sync(self) -> None:
        # Create the topic before subscribing, so the subscription never races topic auto-creation
        # (a consumer subscribed to a missing topic only notices it at the next metadata refresh).
        ensure_topics(self.bootstrap, [self.topic], partitions=self._topic_partitions)
        consumer = Consumer(self._config)
        consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)
        self._consumer = consumer

    async def close(self) -> None:
        if self._closed or self._thread is None:
            self._closed = True
            return
        self._closed = True
        try:
            await self._call(self._close_sync)
        finally:
            self._thread.shutdown(wait=False)

    def _close_sync(self) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        self._commit_sync(consumer, asynchronous=False)
        # close() leaves the group, so the partitions move to another member at once, not after the
        # session timeout.
        consumer.close()
        self._consumer = None

    # --- consuming ------------------------------------------------------------------------

    async def poll(self, max_messages: int, wait_sec: float) -> list[Delivery]:
        return await self._call(self._poll_sync, max_messages, wait_sec)

    def _poll_sync(self, max_messages: int, timeout: float) -> list[Delivery]:
        consumer = self._live_consumer()
        if self._paused:
            assignment = consumer.assignment()
            consumer.resume(assignment)
            self._paused = False
            self._kick(consumer, assignment)
        return self._take(consumer, max_messages, timeout)

    @staticmethod
    def _kick(consumer: Consumer, assignment: list[TopicPartition]) -> None:
        """Wake the broker thread after a resume (see the module docstring) with one ListOffsets round trip."""
        if assignment:
            try:
                consumer.get_watermark_offsets(assignment[0], timeout=1.0, cached=False)
            except KafkaException as exc:  # the tick fetches a second later anyway
                log.debug("resume kick failed: %s", exc)

    async def park(self, max_messages: int) -> list[Delivery]:
        return await self._call(self._park_sync, max_messages)

    def _park_sync(self, max_messages: int) -> list[Delivery]:
        consumer = self._live_consumer()
        # librdkafka 2.16 was seen never to fetch a partition paused before its first fetch: a partition assigned
        # lately keeps fetching until it has settled.
        if not self._paused and time.monotonic() - self._assigned_at >= _SETTLE_SEC:
            consumer.pause(consumer.assignment())
            self._paused = True
        return self._take(consumer, max_messages, 0)

    def _take(self, consumer: Consumer, max_messages: int, timeout: float) -> list[Delivery]:
        # consume(n, t) waits until n messages or t elapsed, whichever comes first: wait for one
        # message (low latency), then take whatever else is already fetched (batching).
        messages = consumer.consume(1, timeout)
        if messages and max_messages > 1:
            messages.extend(consumer.consume(max_messages - 1, 0))
        deliveries: list[Delivery] = []
        for message in messages:
            if not self._usable(message):
                continue
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            assert topic is not None and partition is not None and offset is not None
            deliveries.append(
                Delivery(topic, partition, offset, message.value(), _traceparent(message), _timestamp(message))
            )
        # A message of a partition revoked between the two consume() calls is still run (the start CAS keeps that
        # safe), but its offset belongs to the new owner now: only the assigned partitions' offsets are tracked.
        self._assignment.track(((d.topic, d.partition), d.offset) for d in deliveries)
        return deliveries

    async def keepalive(self, wait_sec: float) -> None:
        await self._call(self._keepalive_sync, wait_sec)

    def _keepalive_sync(self, timeout: float) -> None:
        consumer = self._live_consumer()
        consumer.pause(consumer.assignment())
        self._paused = True
        messages = [m for m in consumer.consume(64, timeout) if self._usable(m)]
        if not messages:
            return
        # Partitions assigned during this call are not paused yet and may have delivered: put them
        # back, so they are taken when a slot is free (nothing is claimed that cannot start now).
        first: dict[TopicPartitionKey, int] = {}
        for m in messages:
            topic, partition, offset = m.topic(), m.partition(), m.offset()
            assert topic is not None and partition is not None and offset is not None
            first[(topic, partition)] = min(offset, first.get((topic, partition), offset))
        for (topic, partition), offset in first.items():
            consumer.seek(TopicPartition(topic, partition, offset))
        consumer.pause(consumer.assignment())
        log.debug("saturated: put back %d messages", len(messages))

    def _usable(self, message: Message) -> bool:
        err = message.error()
        if err is None:
            return True
        if err.code() == KafkaError._PARTITION_EOF:
            return False
        if err.fatal():
            raise KafkaException(err)
        # Unknown topic (the broker restarted empty), transport errors: librdkafka retries these.
        log.warning("kafka consume error on %s: %s", self.topic, err)
        return False

    # --- acknowledging and committing -----------------------------------------------------

    def ack(self, delivery: Delivery) -> None:
        self._assignment.ack((delivery.topic, delivery.partition), delivery.offset)

    def ack_many(self, deliveries: Sequence[Delivery]) -> None:
        self._assignment.ack_many(((d.topic, d.partition), d.offset) for d in deliveries)

    async def commit(self) -> int:
        if self._closed or self._consumer is None:
            return 0
        if not self._assignment.anything_to_commit():
            return 0  # nothing moved (an idle worker's every tick): no trip through the consumer's thread
        return await self._call(self._commit_live)

    def _commit_live(self) -> int:
        consumer = self._consumer
        return 0 if consumer is None else self._commit_sync(consumer, asynchronous=True)

    def _commit_sync(self, consumer: Consumer, *, asynchronous: bool) -> int:
        positions = self._assignment.to_commit()
        if not positions:
            return 0
        offsets = [TopicPartition(topic, partition, offset) for (topic, partition), offset in positions.items()]
        try:
            if asynchronous:
                consumer.commit(offsets=offsets, asynchronous=True)
            else:
                consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # Not fatal: the next commit covers these partitions again, and at worst a few messages
            # are delivered again and lose the start CAS.
            log.warning("offset commit failed: %s", exc)
            self._assignment.commit_failed(positions)
            return 0
        return len(offsets)

    async def lag(self) -> dict[int, int]:
        if self._closed or self._consumer is None:
            return {}
        return await self._call(self._lag_sync)

    def _lag_sync(self) -> dict[int, int]:
        consumer = self._live_consumer()
        assigned = [TopicPartition(topic, partition) for topic, partition in self._assignment.partitions()]
        lag: dict[int, int] = {}
        for tp in consumer.position(assigned) if assigned else []:
            # One ListOffsets round trip per partition, every few seconds (CommitConfig.lag_interval_sec).
            _low, high = consumer.get_watermark_offsets(tp, timeout=1.0, cached=False)
            # A partition this consumer has not read from yet has no position: all of it is lag.
            position = tp.offset if tp.offset >= 0 else _low
            lag[tp.partition] = max(0, high - position)
        return lag

    def pending(self) -> int:
        """Messages handed out and not yet acknowledged, over all assigned partitions (for tests)."""
        return self._assignment.pending()

    # --- callbacks (on the consumer thread, from inside consume()) ------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Cooperative protocol: ``partitions`` are only the ones added to this member's assignment, and they
        # are added with incremental_assign (assign() would replace the whole assignment, and fails here).
        keys = {(p.topic, p.partition) for p in partitions}
        if partitions:
            try:
                consumer.incremental_assign(partitions)
                # librdkafka keeps a partition's pause flag across a rebalance: one paused when it was taken
                # away (this worker was saturated, then stopped past its session timeout) would come back
                # paused and never be read again, so resume what was assigned. Not paused here even when every
                # slot is busy: a partition paused before its first fetch was seen never to fetch again after
                # its resume (librdkafka 2.16; a stress of members joining and leaving beside a saturated one
                # left whole partitions unread) — the keepalive hands back what it takes instead.
                consumer.resume(partitions)
            except KafkaException as exc:
                log.warning("could not set up newly assigned partitions: %s", exc)
        self._assignment.assign(keys)
        self._assigned_at = time.monotonic()
        if partitions or not self._ready.is_set():
            log.info("partitions assigned: %s", _describe(partitions) or "none (more members than partitions)")
        if self._loop is not None and not self._ready.is_set():
            self._loop.call_soon_threadsafe(self._ready.set)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = {(p.topic, p.partition) for p in partitions}
        positions = self._assignment.revoke(keys)
        if positions:
            offsets = [TopicPartition(t, p, o) for (t, p), o in positions.items()]
            try:
                consumer.commit(offsets=offsets, asynchronous=False)
            except KafkaException as exc:
                log.warning("commit on revoke failed: %s", exc)
        if partitions:
            log.info("partitions revoked: %s", _describe(partitions))

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Lost (session expired): the partitions may already be someone else's; committing could
        # move their offsets under the new owner, so just let go.
        keys = {(p.topic, p.partition) for p in partitions}
        self._assignment.lose(keys)
        log.warning("partitions lost: %s", _describe(partitions))

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._fatal = err
            log.error("fatal kafka error: %s", err)
        else:
            log.warning("kafka: %s", err)

    # --- plumbing -------------------------------------------------------------------------

    def _live_consumer(self) -> Consumer:
        if self._fatal is not None:
            raise KafkaException(self._fatal)
        if self._consumer is None:
            raise RuntimeError("the Kafka consumer is not open")
        return self._consumer

    async def _call(self, func: Callable[..., T], *args: Any) -> T:
        if self._thread is None:
            raise RuntimeError("the Kafka consumer is not open")
        return await asyncio.get_running_loop().run_in_executor(self._thread, func, *args)


def _traceparent(message: Message) -> str | None:
    headers = message.headers()
    # Consumed messages carry a list of (name, value) pairs; the dict form only exists for producing.
    pairs = headers.items() if isinstance(headers, dict) else headers or ()
    for name, value in pairs:
        if name == "traceparent" and value is not None:
            return value.decode() if isinstance(value, bytes) else value
    return None


def _timestamp(message: Message) -> datetime | None:
    kind, millis = message.timestamp()
    return None if kind == TIMESTAMP_NOT_AVAILABLE else datetime.fromtimestamp(millis / 1000, UTC)


def _describe(partitions: Sequence[TopicPartition]) -> str:
    return ", ".join(f"{p.topic}[{p.partition}]" for p in partitions)
