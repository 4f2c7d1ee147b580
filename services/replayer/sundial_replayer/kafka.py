"""The replayer's side of Kafka: reading a source topic by partition and offset, publishing to a staging topic.

:class:`ReplayKafka` is the small interface the replayer depends on; :class:`KafkaReplayKafka` its
confluent-kafka implementation. Reading *assigns* partitions at explicit offsets: the consumer joins no
group and commits nothing, so the production consumer group's offsets are never read or moved (its
``group.id`` is required by librdkafka and names the replayer, never a pool's group). End of partition is
reported (``enable.partition.eof``), which is how the end of a window is found on a broker without a time
index. Publishing produces a whole batch and waits for every acknowledgement (``acks=all``) before the
replayer commits its progress past it.

Every call runs on one dedicated thread (confluent-kafka blocks), so the event loop stays free.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from sundial_common.broker.kafka import NO_METRICS_PUSH, ensure_topics

log = logging.getLogger("sundial.replayer.kafka")

T = TypeVar("T")
Headers = list[tuple[str, str | bytes | None]]


@dataclass(frozen=True, slots=True)
class SourceMessage:
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: Headers


@dataclass(frozen=True, slots=True)
class OutRecord:
    key: bytes | None
    value: bytes | None
    headers: Headers


@dataclass(slots=True)
class ReadBatch:
    messages: list[SourceMessage] = field(default_factory=list)
    #: Partitions whose end was reached during this read: partition → the offset after its last message.
    ends: dict[int, int] = field(default_factory=dict)


class ReplayKafka(Protocol):
    async def read(self, topic: str, positions: dict[int, int], max_messages: int, wait_sec: float) -> ReadBatch:
        """Messages from each partition at or after its position in ``positions`` (others are not read)."""
        ...

    async def publish(self, topic: str, records: Sequence[OutRecord]) -> None:
        """Publish a batch; returns once the broker acknowledged all of it, raises if any failed."""
        ...

    async def ensure_topic(self, topic: str) -> None: ...

    async def close(self) -> None: ...


class KafkaReplayKafka:
    """One assign-only consumer and one producer, driven from one thread."""

    def __init__(self, bootstrap: str, *, client_id: str, publish_timeout_sec: float = 30.0) -> None:
        self._bootstrap = bootstrap
        self._timeout = publish_timeout_sec
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sundial-replayer-kafka")
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "sundial.replayer",  # never joined (assign only) and never committed
                "client.id": client_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 50,
                "queued.max.messages.kbytes": 262144,
                **NO_METRICS_PUSH,
            }
        )
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": client_id,
                "acks": "all",
                "linger.ms": 5,
                "batch.num.messages": 10000,
                "queue.buffering.max.messages": 500000,
                "message.timeout.ms": int(publish_timeout_sec * 1000),
                **NO_METRICS_PUSH,
            }
        )
        self._topic: str | None = None
        #: Where the current assignment will read next, per partition (so a continuing read keeps its fetch queue).
        self._expected: dict[int, int] = {}

    async def _call(self, func: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, func, *args)

    async def read(self, topic: str, positions: dict[int, int], max_messages: int, wait_sec: float) -> ReadBatch:
        return await self._call(self._read, topic, dict(positions), max_messages, wait_sec)

    def _read(self, topic: str, positions: dict[int, int], max_messages: int, wait_sec: float) -> ReadBatch:
        if topic != self._topic or positions != self._expected:
            self._consumer.assign([TopicPartition(topic, p, offset) for p, offset in positions.items()])
            self._topic, self._expected = topic, dict(positions)
        batch = ReadBatch()
        # consume(n, t) waits until n messages are there or t passed: wait for one message only, then take
        # whatever else is already fetched (waiting for a full batch cost a whole timeout per batch).
        messages = self._consumer.consume(1, wait_sec)
        if messages and max_messages > 1:
            messages.extend(self._consumer.consume(max_messages - 1, 0))
        for message in messages:
            partition, offset = message.partition(), message.offset()
            assert partition is not None and offset is not None
            err = message.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    batch.ends[partition] = offset
                    continue
                if err.fatal():
                    raise KafkaException(err)
                log.warning("kafka consume error on %s[%s]: %s", topic, partition, err)
                continue
            self._expected[partition] = offset + 1
            timestamp_ms = message.timestamp()[1]
            batch.messages.append(
                SourceMessage(partition, offset, timestamp_ms, message.key(), message.value(), _headers(message))
            )
        return batch

    async def publish(self, topic: str, records: Sequence[OutRecord]) -> None:
        if records:
            await self._call(self._publish, topic, records)

    def _publish(self, topic: str, records: Sequence[OutRecord]) -> None:
        failures: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                failures.append(err)

        produce = self._producer.produce
        for record in records:
            try:
                produce(topic, record.value, key=record.key, headers=record.headers, on_delivery=delivered)
            except BufferError:
                self._producer.poll(0.5)  # local queue full: let librdkafka drain a little, then once more
                produce(topic, record.value, key=record.key, headers=record.headers, on_delivery=delivered)
        remaining = self._producer.flush(self._timeout)
        if remaining or failures:
            raise KafkaException(failures[0] if failures else KafkaError(KafkaError._MSG_TIMED_OUT))

    async def ensure_topic(self, topic: str) -> None:
        await self._call(ensure_topics, self._bootstrap, [topic])

    async def close(self) -> None:
        def close() -> None:
            self._producer.flush(5)
            self._consumer.close()

        await self._call(close)
        self._thread.shutdown(wait=False)


def _headers(message: Message) -> Headers:
    raw = message.headers()
    pairs = raw.items() if isinstance(raw, dict) else raw or ()
    return list(pairs)
