"""Which Kafka offsets a worker may commit: the contiguous prefix of messages whose Postgres write is done.

A message is *in flight* from the moment the consumer hands it out until the worker has written
its outcome to Postgres (or decided, through the start CAS, that there is nothing to write). A
partition's committed offset may only move past messages that are all done, so that a crash
never loses a message whose handler still runs: everything from the first unfinished message on
is delivered again, and the start CAS (DESIGN invariant 5) turns the redeliveries of finished
executions into no-ops.

Messages of one partition arrive in offset order, so each partition keeps its tracked offsets in a
deque in arrival order plus the set of those not done yet; the committable position is found by
popping finished offsets off the front. That is O(1) amortised per message, whatever the order in
which handlers finish.

This module is pure (no I/O, no locks); the Kafka consumer adapter serialises access to it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

TopicPartitionKey = tuple[str, int]


@dataclass(slots=True)
class _Partition:
    order: deque[int] = field(default_factory=deque)  # tracked offsets, in arrival (= offset) order
    unfinished: set[int] = field(default_factory=set)  # the tracked offsets not done yet
    # The next offset to consume once everything before it is done (Kafka's commit semantics).
    position: int | None = None
    committed: int | None = None


class OffsetTracker:
    """Per-partition in-flight offsets and the commit position each one allows."""

    def __init__(self) -> None:
        self._partitions: dict[TopicPartitionKey, _Partition] = {}

    def add(self, tp: TopicPartitionKey, offset: int) -> None:
        """Record that the message at ``offset`` was handed out and is not finished yet."""
        part = self._partitions.setdefault(tp, _Partition())
        last = part.order[-1] if part.order else (part.position - 1 if part.position is not None else None)
        if last is not None and offset <= last:
            # A seek (or a rebalance back to us) replays offsets we already track or settled: the
            # earlier entry still guards the commit position, so the replay adds nothing to wait for.
            return
        part.order.append(offset)
        part.unfinished.add(offset)

    def done(self, tp: TopicPartitionKey, offset: int) -> None:
        """Record that the message at ``offset`` needs nothing more (its Postgres write is done).

        Unknown partitions are ignored: they were revoked while the message was in flight, and its
        new owner decides the commit position now. So are offsets that are not in flight (replays).
        """
        part = self._partitions.get(tp)
        if part is None or offset not in part.unfinished:
            return
        part.unfinished.discard(offset)
        while part.order and part.order[0] not in part.unfinished:
            part.position = part.order.popleft() + 1

    def pending(self, tp: TopicPartitionKey) -> int:
        """How many messages of ``tp`` are still in flight."""
        part = self._partitions.get(tp)
        return len(part.unfinished) if part else 0

    def committable(self, partitions: Iterable[TopicPartitionKey] | None = None) -> dict[TopicPartitionKey, int]:
        """Positions that moved since the last :meth:`mark_committed` (all partitions, or the ones given)."""
        keys = self._partitions.keys() if partitions is None else partitions
        positions: dict[TopicPartitionKey, int] = {}
        for tp in keys:
            part = self._partitions.get(tp)
            if part is not None and part.position is not None and part.position != part.committed:
                positions[tp] = part.position
        return positions

    def mark_committed(self, positions: Mapping[TopicPartitionKey, int]) -> None:
        for tp, position in positions.items():
            part = self._partitions.get(tp)
            if part is not None:
                part.committed = position

    def mark_uncommitted(self, positions: Mapping[TopicPartitionKey, int]) -> None:
        """A commit of ``positions`` failed: offer them again at the next :meth:`committable`."""
        for tp, position in positions.items():
            part = self._partitions.get(tp)
            if part is not None and part.committed == position:
                part.committed = None

    def forget(self, partitions: Iterable[TopicPartitionKey]) -> None:
        """Drop partitions that were revoked: their commit position is no longer ours to move."""
        for tp in partitions:
            self._partitions.pop(tp, None)

    def partitions(self) -> list[TopicPartitionKey]:
        return list(self._partitions)
