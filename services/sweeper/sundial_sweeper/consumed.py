"""How far a pool's consumer group has come: the instant before which every message of its topic was acknowledged.

The broker (Tansu, memory storage) was seen to drop a message it had acknowledged, rarely: its execution stays
PENDING with ``published_at`` set, and the outbox scan's ``unstarted_after_sec`` (60 s) was what re-sent it, a minute
late. That window cannot be shortened by time alone: in a backlog a message legitimately waits in the topic longer
than any short window, and re-sending those doubled the broker's and the workers' load (bench W3 at 5,000/s).

The consumer group's committed offsets tell the two apart. A worker commits a partition's offset only past messages
it has acknowledged, and it acknowledges a message only once its execution has started (and its outcome is
written) or its start compare-and-swap lost; a message held for its due instant (publish ahead) is not acknowledged
(``sundial_worker.offsets``, ``sundial_worker.holding``). So once the group's committed offset has passed the
message, the execution is no longer PENDING — unless the message was never in the topic. Which offset an
execution's message got is not recorded anywhere (that would be a write per execution), and a batch goes to any
partition, so this works with instants instead:

- each :meth:`ConsumedHorizon.horizon` call reads the group's committed offsets, then notes the instant ``t`` and
  reads every partition's high watermark;
- a later read whose watermark is higher names an offset (the new watermark less one) of a message appended after
  ``t``, so every message appended before ``t`` lies below it (:func:`_passed`; the watermark itself is not trusted:
  Tansu answers the base offset of the last batch plus one);
- the horizon is the latest noted ``t`` below whose later offsets the committed offsets have all come, in every
  partition: every message appended before it has been acknowledged.

An execution's ``published_at`` is written after the broker acknowledged its message (the dispatcher marks it a
second later, the sweeper right after its re-send), so a PENDING execution published before the horizon (less
``skew``: Postgres' clock against this process's) has no message left in the topic, and is sent again. A re-send
that was not needed costs a duplicate message, which the start compare-and-swap drops; no start is duplicated.

Reads happen only for pools that have PENDING executions published (the sweeper asks), two requests and one per
partition: nothing while the stack idles. A pool with no worker, a partition nobody reads, or one that received
nothing since (a pool that stopped publishing) never lets the horizon pass: those keep the 60 s window.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from sundial_common.broker import NO_METRICS_PUSH
from sundial_common.messages import pool_group, pool_topic

log = logging.getLogger(__name__)

#: Watermark samples kept per pool (one per sweeper pass): how far back the committed offsets may lag and still
#: give a horizon. 60 of 2 s passes: as long as the outbox scan's own window.
_SAMPLES = 60


class ConsumedHorizon:
    """Per pool, the instant before which every message of its topic was acknowledged by the pool's group.

    Blocking (librdkafka); the sweeper calls it from a thread. The groups' committed offsets come through an admin
    client (no client of the pool's group, which could be taken for a member); metadata and watermarks through a
    consumer of a group of its own that never subscribes nor commits.
    """

    def __init__(
        self, bootstrap: str, timeout_sec: float = 2.0, now: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self._bootstrap = bootstrap
        self._timeout = timeout_sec
        self._now = now
        self._admin: AdminClient | None = None
        self._consumer: Consumer | None = None
        #: Per pool: (instant, high watermark per partition read just after it), oldest first.
        self._samples: dict[str, deque[tuple[datetime, dict[int, int]]]] = {}

    def horizon(self, pool: str) -> datetime | None:
        """The latest instant before which every message of the pool's topic has been acknowledged, as far as the
        samples so far show; None if none shows it yet, or the broker did not answer."""
        try:
            committed, instant, highs = self._read(pool)
        except (KafkaException, TimeoutError) as exc:
            log.debug("consumer group of pool %s unreadable: %r", pool, exc)
            return None
        samples = self._samples.setdefault(pool, deque(maxlen=_SAMPLES))
        if any(seen.keys() != highs.keys() or any(seen[p] > high for p, high in highs.items()) for _, seen in samples):
            samples.clear()  # a watermark gone back (the broker lost its data) or the partitions changed
        samples.append((instant, highs))
        passed = None
        while samples and _passed(samples, committed):
            passed = samples.popleft()
        if passed is not None:
            samples.appendleft(passed)  # still the horizon until a later sample is passed
            return passed[0]
        return None

    def forget(self, keep: set[str]) -> None:
        """Drop the samples of pools not in ``keep`` (no PENDING execution published any more)."""
        for pool in [p for p in self._samples if p not in keep]:
            del self._samples[pool]

    def close(self) -> None:
        self._samples.clear()
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._admin = None

    def _read(self, pool: str) -> tuple[dict[int, int], datetime, dict[int, int]]:
        """The group's committed offset per partition (0 where none), then the instant, then the high watermarks."""
        if self._admin is None or self._consumer is None:
            self._admin = AdminClient({"bootstrap.servers": self._bootstrap, **NO_METRICS_PUSH})
            self._consumer = Consumer(
                {
                    "bootstrap.servers": self._bootstrap,
                    "group.id": "sundial-sweeper-watermarks",
                    "enable.auto.commit": False,
                    **NO_METRICS_PUSH,
                }
            )
        topic = pool_topic(pool)
        metadata = self._consumer.list_topics(topic, timeout=self._timeout).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            raise KafkaException(f"no partitions for {topic}")
        partitions = [TopicPartition(topic, p) for p in sorted(metadata.partitions)]
        request = ConsumerGroupTopicPartitions(pool_group(pool), partitions)
        answer = self._admin.list_consumer_group_offsets([request])[pool_group(pool)].result(self._timeout)
        committed = {tp.partition: max(tp.offset, 0) for tp in answer.topic_partitions if tp.error is None}
        instant = self._now()
        highs = {
            tp.partition: self._consumer.get_watermark_offsets(tp, timeout=self._timeout, cached=False)[1]
            for tp in partitions
        }
        return committed, instant, highs


def _passed(samples: deque[tuple[datetime, dict[int, int]]], committed: dict[int, int]) -> bool:
    """Whether the group has acknowledged every message appended before the first sample's instant.

    The watermark is not taken as the end of what was appended: Tansu answers the base offset of the partition's last
    batch plus one, short of the batch's other messages (a batch of 10 reads 1). Whatever the broker answers, the
    offset just below a *later, higher* answer is a message appended after the first sample was read, so every message
    appended before its instant lies below it: the group has acknowledged them all once its committed offset reaches
    that offset, in every partition. A partition with no later batch yet (idle) tells nothing: no horizon until
    it has one (the 60 s window covers a pool that publishes nothing more)."""
    first = samples[0][1]
    for partition, high in first.items():
        later = next((seen[partition] for _, seen in samples if seen[partition] > high), None)
        if later is None or committed.get(partition, 0) < later - 1:
            return False
    return True
