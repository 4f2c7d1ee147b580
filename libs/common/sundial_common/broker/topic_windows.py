"""What a replay needs to know of a pool's topic: does it exist, how far back it reaches, and where a window lies.

:class:`TopicInspector` is the small interface the API (to validate ``POST /v1/replays``) and
the replayer (to resolve a window to offsets) depend on; :class:`KafkaTopicInspector` is its confluent-kafka
implementation. It reads offsets and configs only: it joins no consumer group and commits nothing.

**How far back.** The earliest instant still available is the later of ``now - retention.ms`` (the topic's
config) and, on partitions whose oldest messages were already deleted (low watermark above 0), the
timestamp of the oldest message left: a window starting earlier would silently miss messages.

**Offsets for times.** Kafka answers, per partition, the first offset whose timestamp is at or after an
instant (``offsets_for_times``). Tansu (the test broker) answers offset 0 for every instant, so a broker
whose answer for an instant far in the future is an offset (Kafka answers -1: none) is treated as having no
time index: the window starts at the partition's low watermark and its end is found by reading (the
replayer stops a partition at its first message stamped at or after the window's end, or at its end).
Either way every message is checked against the window, so the result is the same; only the scan is longer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from sundial_common.broker.kafka import NO_METRICS_PUSH
from sundial_common.runtime.clock import from_ms, to_ms
from sundial_common.stores.replays import PartitionWindow

log = logging.getLogger(__name__)

T = TypeVar("T")
# Kafka answers -1 for "no message at or after this instant"; a broker answering an offset for an instant
# ten years ahead has no time index.
_FAR_FUTURE = timedelta(days=3650)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    topic: str
    partitions: tuple[int, ...]
    #: The topic's ``retention.ms`` (None: not set or not readable; -1: forever).
    retention_ms: int | None
    #: The earliest instant whose messages are all still there; None: every message ever published is.
    earliest_available: datetime | None


class TopicInspector(Protocol):
    async def describe(self, topic: str, now: datetime) -> TopicInfo | None:
        """The topic's partitions and reach; None if it does not exist."""
        ...

    async def resolve_window(self, topic: str, start: datetime, end: datetime) -> list[PartitionWindow]:
        """Per partition, the offsets of ``[start, end)`` (end None where the broker cannot tell)."""
        ...

    async def close(self) -> None: ...


class KafkaTopicInspector:
    """Topic metadata, configs and offsets from Kafka, on one dedicated thread."""

    def __init__(self, bootstrap: str, *, timeout_sec: float = 5.0) -> None:
        self._bootstrap = bootstrap
        self._timeout = timeout_sec
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sundial-topics")
        self._admin: AdminClient | None = None
        self._consumer: Consumer | None = None

    def _clients(self) -> tuple[AdminClient, Consumer]:
        if self._admin is None or self._consumer is None:
            self._admin = AdminClient({"bootstrap.servers": self._bootstrap})
            # A group id is required to build a consumer; it is never joined (assign only) nor committed.
            self._consumer = Consumer(
                {
                    "bootstrap.servers": self._bootstrap,
                    "group.id": "sundial.topic-inspector",
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    **NO_METRICS_PUSH,
                }
            )
        return self._admin, self._consumer

    async def _call(self, func: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, func, *args)

    async def describe(self, topic: str, now: datetime) -> TopicInfo | None:
        return await self._call(self._describe, topic, now)

    def _describe(self, topic: str, now: datetime) -> TopicInfo | None:
        admin, consumer = self._clients()
        metadata = admin.list_topics(timeout=self._timeout).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            return None
        partitions = tuple(sorted(metadata.partitions))
        retention_ms = self._retention_ms(admin, topic)
        bounds: list[datetime] = []
        if retention_ms is not None and retention_ms >= 0:
            bounds.append(now - timedelta(milliseconds=retention_ms))
        for partition in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), self._timeout, False)
            if low > 0 and high > low:  # older messages were deleted: the oldest left bounds the reach
                oldest = self._timestamp_at(consumer, topic, partition, low)
                if oldest is not None:
                    bounds.append(oldest)
        return TopicInfo(topic, partitions, retention_ms, max(bounds) if bounds else None)

    def _retention_ms(self, admin: AdminClient, topic: str) -> int | None:
        try:
            futures = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
            for future in futures.values():
                entry = future.result(self._timeout).get("retention.ms")
                if entry is not None and entry.value is not None:
                    return int(entry.value)
        except (KafkaException, ValueError) as exc:
            log.warning("could not read retention.ms of %s: %s", topic, exc)
        return None

    def _timestamp_at(self, consumer: Consumer, topic: str, partition: int, offset: int) -> datetime | None:
        consumer.assign([TopicPartition(topic, partition, offset)])
        try:
            for message in consumer.consume(1, self._timeout):
                if message.error() is None:
                    return from_ms(message.timestamp()[1])
        finally:
            consumer.unassign()
        return None

    async def resolve_window(self, topic: str, start: datetime, end: datetime) -> list[PartitionWindow]:
        return await self._call(self._resolve_window, topic, start, end)

    def _resolve_window(self, topic: str, start: datetime, end: datetime) -> list[PartitionWindow]:
        admin, consumer = self._clients()
        metadata = admin.list_topics(topic, timeout=self._timeout).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            raise LookupError(f"topic {topic} does not exist")
        partitions = sorted(metadata.partitions)
        marks = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), self._timeout, False) for p in partitions}
        probes = [to_ms(start), to_ms(end), to_ms(end + _FAR_FUTURE)]
        answers: dict[int, list[int]] = {p: [] for p in partitions}
        for ms in probes:
            found = consumer.offsets_for_times([TopicPartition(topic, p, ms) for p in partitions], self._timeout)
            for tp in found:
                answers[tp.partition].append(tp.offset)
        windows: list[PartitionWindow] = []
        for p in partitions:
            low, high = marks[p]
            at_start, at_end, far = answers[p]
            if high <= low:
                windows.append(PartitionWindow(p, high, high))
            elif far >= 0:  # no time index (Tansu): read from the oldest message, find the end by reading
                windows.append(PartitionWindow(p, low, None))
            else:
                first = high if at_start < 0 else min(max(at_start, low), high)
                last = high if at_end < 0 else min(max(at_end, first), high)
                windows.append(PartitionWindow(p, first, last))
        return windows

    async def close(self) -> None:
        def close() -> None:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None

        await self._call(close)
        self._thread.shutdown(wait=False)


def replay_headers_of(pairs: Sequence[tuple[str, bytes | None]] | None) -> dict[str, str]:
    """The ``sundial-replay-*`` headers of a message, decoded (empty for a message that is not a replay's)."""
    out: dict[str, str] = {}
    for name, value in pairs or ():
        if name.startswith(REPLAY_HEADER_PREFIX) and value is not None:
            out[name[len(REPLAY_HEADER_PREFIX) :]] = value.decode()
    return out


#: Headers a replayed message carries besides its original ones: ``sundial-replay-id``,
#: ``-execution-id``, ``-topic``, ``-partition``, ``-offset``, ``-timestamp`` (epoch ms).
REPLAY_HEADER_PREFIX = "sundial-replay-"
