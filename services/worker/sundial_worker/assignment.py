"""What the worker's Kafka consumer holds: its assigned partitions and the offsets of them it may commit.

This is the one state the consumer's own thread (consume, commit, the rebalance callbacks) shares with the event
loop (acknowledgements, :meth:`~sundial_worker.consumer.KafkaExecutionConsumer.commit`), so every method takes the
one lock. The offsets themselves are :class:`~sundial_worker.offsets.OffsetTracker`'s; a message of a partition
that is no longer assigned here is not tracked (its offsets are the new owner's).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from sundial_worker.offsets import OffsetTracker, TopicPartitionKey

#: A message as the assignment sees it: its partition and offset.
Position = tuple[TopicPartitionKey, int]


class Assignment:
    """The partitions assigned to this member and their in-flight offsets, behind one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tracker = OffsetTracker()
        self._assigned: set[TopicPartitionKey] = set()

    # --- messages ---------------------------------------------------------------------------

    def track(self, handed_out: Iterable[Position]) -> None:
        """Messages handed out: each one of an assigned partition holds its commit position back until acknowledged."""
        with self._lock:
            assigned = self._assigned
            for tp, offset in handed_out:
                if tp in assigned:
                    self._tracker.add(tp, offset)

    def ack(self, tp: TopicPartitionKey, offset: int) -> None:
        with self._lock:
            self._tracker.done(tp, offset)

    def ack_many(self, done: Iterable[Position]) -> None:
        with self._lock:
            for tp, offset in done:
                self._tracker.done(tp, offset)

    def pending(self) -> int:
        """Messages handed out and not yet acknowledged, over all tracked partitions."""
        with self._lock:
            return sum(self._tracker.pending(tp) for tp in self._tracker.partitions())

    # --- commits ----------------------------------------------------------------------------

    def anything_to_commit(self) -> bool:
        with self._lock:
            return bool(self._tracker.committable(self._assigned))

    def to_commit(self) -> dict[TopicPartitionKey, int]:
        """The positions that moved, marked committed (:meth:`commit_failed` offers them again)."""
        with self._lock:
            positions = self._tracker.committable(self._assigned)
            if positions:
                self._tracker.mark_committed(positions)
            return positions

    def commit_failed(self, positions: dict[TopicPartitionKey, int]) -> None:
        with self._lock:
            self._tracker.mark_uncommitted(positions)

    # --- rebalances -------------------------------------------------------------------------

    def partitions(self) -> list[TopicPartitionKey]:
        with self._lock:
            return list(self._assigned)

    def assign(self, partitions: set[TopicPartitionKey]) -> None:
        with self._lock:
            self._assigned |= partitions

    def revoke(self, partitions: set[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """Let ``partitions`` go; returns the positions of them still to commit (before they go)."""
        with self._lock:
            positions = self._tracker.committable(partitions & self._assigned)
            self._lose(partitions)
            return positions

    def lose(self, partitions: set[TopicPartitionKey]) -> None:
        """Let ``partitions`` go without committing (they may be someone else's already)."""
        with self._lock:
            self._lose(partitions)

    def _lose(self, partitions: set[TopicPartitionKey]) -> None:
        self._tracker.forget(partitions)
        self._assigned -= partitions
