"""How far a pool's consumer group has come: the instant before which every message of its topic was acknowledged.

The broker (Tansu, memory storage) was seen to drop a message it had acknowledged, rarely: its execution stays
PENDING with ``published_at`` set, and the outbox scan's ``unstarted_after_sec`` (60 s) was what re-sent it, a minute
late. That window cannot be shortened by time alone: in a backlog a message legitimately waits in the topic longer
than any short window, and re-sending those doubled the broker's and the workers' load (a steady 5,000 a second).

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

**A partition that receives nothing more** (a burst's end, a spread stream's last jobs) has no later batch to compare
with, so its last messages — the very ones a burst's end may lose — would never be passed. For those the horizon makes
its own later batch: when the caller says how far it must reach (``wanted``: the oldest PENDING execution's publication
plus the skew), this read's instant is past that, no sample shows it passed, a partition's watermark has not moved since
the previous read (nothing appended for a pass) and the group has come to its last batch there, a **marker** (a message
with no value: :mod:`sundial_common.broker.messages`) is appended to that partition. It lies after this read's instant,
so the next read sees a later, higher watermark; once the group's committed offset reaches the marker — the workers
acknowledged what was before it; they acknowledge the marker too and run nothing — every message appended before this
read was acknowledged. A dropped last message so costs a few passes, not the 60 s window. Markers go only to quiet
partitions (none while a pool's messages flow) and only once the group has come to the last batch (a pool with no worker
gets at most two, not one a pass).

Reads happen only for pools that have PENDING executions published (the sweeper asks), two requests and one per
partition: nothing while the stack idles. A pool with no worker or a partition nobody reads never lets the horizon
pass: those keep the 60 s window.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from sundial_common.broker.kafka import NO_METRICS_PUSH
from sundial_common.broker.messages import pool_group, pool_topic

log = logging.getLogger(__name__)

#: Watermark samples kept per pool (one per sweeper pass): how far back the committed offsets may lag and still
#: give a horizon. 60 of 2 s passes: as long as the outbox scan's own window.
_SAMPLES = 60


class ConsumedHorizon:
    """Per pool, the instant before which every message of its topic was acknowledged by the pool's group.

    Blocking (librdkafka); the sweeper calls it from a thread. The groups' committed offsets come through an admin
    client (no client of the pool's group, which could be taken for a member); metadata and watermarks through a
    consumer of a group of its own that never subscribes nor commits; markers through a producer of its own.
    """

    def __init__(
        self, bootstrap: str, timeout_sec: float = 2.0, now: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self._bootstrap = bootstrap
        self._timeout = timeout_sec
        self._now = now
        self._admin: AdminClient | None = None
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        #: Per pool: (instant, high watermark per partition read just after it), oldest first.
        self._samples: dict[str, deque[tuple[datetime, dict[int, int]]]] = {}

    def horizon(self, pool: str, wanted: datetime | None = None) -> datetime | None:
        """The latest instant before which every message of the pool's topic has been acknowledged, as far as the
        samples so far show; None if none shows it yet, or the broker did not answer.

        ``wanted``, if given, is how far the horizon must reach to be of use: short of it, the partitions that stayed
        quiet since the previous read get a marker (module docstring), so that a later read can pass them."""
        try:
            committed, instant, highs = self._read(pool)
        except (KafkaException, TimeoutError) as exc:
            log.debug("consumer group of pool %s unreadable: %r", pool, exc)
            return None
        samples = self._samples.setdefault(pool, deque(maxlen=_SAMPLES))
        previous = samples[-1][1] if samples else None
        if any(seen.keys() != highs.keys() or any(seen[p] > high for p, high in highs.items()) for _, seen in samples):
            samples.clear()  # a watermark gone back (the broker lost its data) or the partitions changed
            previous = None
        samples.append((instant, highs))
        passed = None
        while samples and _passed(samples, committed):
            passed = samples.popleft()
        if passed is not None:
            samples.appendleft(passed)  # still the horizon until a later sample is passed
        horizon = passed[0] if passed is not None else None
        if wanted is not None and previous is not None and instant > wanted and (horizon is None or horizon <= wanted):
            quiet = [p for p, high in highs.items() if previous[p] == high and committed.get(p, 0) >= high - 1]
            if quiet:
                self._mark_quietly(pool, quiet)
        return horizon

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
        self._producer = None

    def _mark_quietly(self, pool: str, partitions: list[int]) -> None:
        """Append a marker to each of the pool's partitions given; a broker that does not take it is asked again at a
        later pass (the partition stays quiet)."""
        try:
            self._mark(pool, partitions)
        except (KafkaException, BufferError, TimeoutError) as exc:
            log.warning("could not append markers to %s%s: %r", pool_topic(pool), partitions, exc)
            return
        log.info(
            "appended a marker to %s%s (quiet, with PENDING executions published before)", pool_topic(pool), partitions
        )

    def _mark(self, pool: str, partitions: list[int]) -> None:
        if self._producer is None:
            self._producer = Producer(
                {"bootstrap.servers": self._bootstrap, "acks": "all", "message.timeout.ms": 5000, **NO_METRICS_PUSH}
            )
        errors: list[KafkaError] = []

        def delivered(err: KafkaError | None, _message: object) -> None:
            if err is not None:
                errors.append(err)

        topic = pool_topic(pool)
        for partition in partitions:
            self._producer.produce(topic, value=None, partition=partition, on_delivery=delivered)
        if self._producer.flush(self._timeout * 3) or errors:
            raise KafkaException(errors[0] if errors else "markers not acknowledged in time")

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
    it has one (a marker, if it stays quiet: :meth:`ConsumedHorizon.horizon`)."""
    first = samples[0][1]
    for partition, high in first.items():
        later = next((seen[partition] for _, seen in samples if seen[partition] > high), None)
        if later is None or committed.get(partition, 0) < later - 1:
            return False
    return True
