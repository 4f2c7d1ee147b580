"""The Kafka side: an asyncio publisher over confluent-kafka, topic creation, and telling a broker that
restarted empty from the one we knew (:class:`KafkaIncarnation`).

confluent-kafka is callback-driven and not asyncio-aware: a daemon thread serves ``poll()`` and runs the
delivery callbacks. A batch is produced in one go and awaited together, so the broker sees batches
(``linger.ms``), never one round trip per message; its delivery reports are counted in the poll thread and
the event loop is woken once, when the last one arrives (:class:`_Deliveries`), not once per message.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from sundial_common.broker.messages import ExecutionMessage
from sundial_common.runtime.settings import CommonSettings

#: In every long-lived librdkafka client's configuration. librdkafka 2.5+ asks the broker for client-metrics
#: subscriptions (KIP-714's GetTelemetrySubscriptions) and, on this broker, asks again and again: 2.4 requests a
#: second of an idle ``make up``'s ~18 (strace of Tansu's reads). Nothing here collects client metrics.
NO_METRICS_PUSH: dict[str, Any] = {"enable.metrics.push": False}

log = logging.getLogger(__name__)


class Publisher(Protocol):
    async def publish(self, messages: Sequence[ExecutionMessage]) -> list[Exception | None]:
        """Publish a batch; one entry per message: None if the broker acknowledged it, else the error."""
        ...

    async def close(self) -> None: ...


class KafkaPublisher:
    """confluent-kafka producer with acks from all in-sync replicas."""

    def __init__(self, bootstrap: str, **overrides: Any) -> None:
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 2,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 500000,
            "message.timeout.ms": 10000,
            "socket.keepalive.enable": True,
            # The broker may come back empty (and with new metadata): notice it quickly.
            "topic.metadata.refresh.interval.ms": 10000,
            **NO_METRICS_PUSH,
        }
        config.update(overrides)
        self._producer = Producer(config)
        self._stopping = threading.Event()
        self._produced = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kafka-producer-poll", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        # Delivery reports come only for queued or in-flight messages: with none, the thread sleeps until
        # publish() produces one instead of polling 20 times a second (a third of an idle sweeper's CPU,
        # py-spy). Cleared before the length is read, so a produce in between is either seen or wakes it.
        while not self._stopping.is_set():
            self._produced.clear()
            if len(self._producer):
                self._producer.poll(0.05)
            else:
                self._produced.wait(1.0)
                self._producer.poll(0)  # error and statistics callbacks, if any

    async def publish(self, messages: Sequence[ExecutionMessage]) -> list[Exception | None]:
        if not messages:
            return []
        deliveries = _Deliveries(asyncio.get_running_loop(), len(messages))
        for index, message in enumerate(messages):
            try:
                self._produce(message, functools.partial(deliveries.delivered, index))
            except (KafkaException, BufferError) as exc:
                deliveries.failed(index, exc)
        self._produced.set()
        await deliveries.done
        return deliveries.errors

    def _produce(self, message: ExecutionMessage, callback: Any) -> None:
        # No key: librdkafka's sticky partitioner puts what is produced within ``sticky.partitioning.linger.ms``
        # (twice the linger) on one partition, so a dispatch pass's batch is one produce request — librdkafka sends
        # a request per partition, and the broker's cost follows its requests and stored batches. Keyed by execution
        # id, a batch was spread over every partition. Nothing relies on an execution's messages sharing a partition:
        # the start compare-and-swap decides which delivery runs, whatever their order.
        value, headers = message.encode(), message.headers()
        try:
            self._producer.produce(message.topic, value, headers=headers, on_delivery=callback)
        except BufferError:
            # Local queue full: let librdkafka drain a little, then try once more.
            self._producer.poll(0.5)
            self._producer.produce(message.topic, value, headers=headers, on_delivery=callback)

    def warm(self, topics: Sequence[str], timeout: float = 5.0) -> None:
        """Blocking. Fetch the metadata of ``topics`` into the producer's cache, so a first publish to one of them
        does not wait for the lookup (sundial_dispatcher.topic_metadata)."""
        for topic in topics:
            self._producer.list_topics(topic, timeout=timeout)

    async def close(self) -> None:
        await asyncio.to_thread(self._producer.flush, 10)
        self._stopping.set()
        self._produced.set()
        await asyncio.to_thread(self._thread.join, 2)


class _Deliveries:
    """The delivery reports of one published batch: each message's error (None: acknowledged), and ``done``,
    resolved once every message has its report.

    The reports arrive in the producer's poll thread (or wherever ``poll``/``flush`` runs); they are counted
    there and the event loop is woken once for the batch: a future and a ``call_soon_threadsafe`` per message
    were a tenth of a dispatcher's samples at 1,500 executions/s (py-spy). ``list.append`` is atomic, so two
    threads polling at once still count each report once; a second wake-up finds ``done`` resolved.
    """

    __slots__ = ("_arrived", "_loop", "_size", "done", "errors")

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int) -> None:
        self._loop = loop
        self._size = size
        self._arrived: list[int] = []
        self.errors: list[Exception | None] = [None] * size
        self.done: asyncio.Future[None] = loop.create_future()

    def delivered(self, index: int, err: KafkaError | None, _msg: Message) -> None:
        """librdkafka's delivery report of message ``index`` (any thread)."""
        if err is not None:
            self.errors[index] = KafkaException(err)
        self._arrived.append(index)
        if len(self._arrived) >= self._size:
            self._loop.call_soon_threadsafe(self._resolve)

    def failed(self, index: int, exc: Exception) -> None:
        """Message ``index`` was never queued (the event loop's thread)."""
        self.errors[index] = exc
        self._arrived.append(index)
        if len(self._arrived) >= self._size:
            self._resolve()

    def _resolve(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


def pool_consumer_config(
    bootstrap: str,
    group: str,
    *,
    client_id: str,
    session_timeout_sec: float,
    on_error: Callable[[KafkaError], None] | None = None,
) -> dict[str, Any]:
    """The confluent-kafka settings of a consumer of a pool's topic (a direct worker's, a worker gateway's feed), and
    why each differs from librdkafka's default. ``on_error``: librdkafka's error callback (None: it logs them)."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "client.id": client_id,
        # Offsets are committed by hand, only once the start (gateway) or the outcome (worker) is decided.
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        # Cooperative (incremental) rebalancing: a member joining or leaving moves only the partitions
        # that change owner, and every other member keeps consuming throughout. The eager default revokes
        # every partition of every member first: measured here, a worker killed in a pool of two stopped the
        # survivor too, ~5 s; with this, the longest pause of the survivor was 0.25 s.
        "partition.assignment.strategy": "cooperative-sticky",
        # How long a silent member (killed, SIGSTOPped) keeps its partitions. tansu also holds a first
        # group join for about half of it (librdkafka's 45 s default left a fresh worker without
        # partitions for ~23 s). 3 s: a restarted worker receives ~2 s after it starts, a dead one's
        # partitions move after ~5 s (session timeout + the rebalance).
        "session.timeout.ms": int(session_timeout_sec * 1000),
        "heartbeat.interval.ms": max(100, int(session_timeout_sec * 1000) // 3),
        # How long the broker may hold a fetch that has no data yet. librdkafka's 500 ms default is the
        # floor of an idle worker's latency: a message produced just after a fetch was parked waited
        # for it. 10 ms costs an idle consumer a few cheap requests a second per broker.
        "fetch.wait.max.ms": 10,
        # A fetch is skipped while a partition already holds this many fetched messages the worker has not taken
        # (it is behind), and looked at again after the backoff: fewer, larger fetches exactly when the worker is
        # saturated, and no change while it keeps up (librdkafka's defaults, 100,000 and 1 s, never skip here).
        "queued.min.messages": 64,
        "fetch.queue.backoff.ms": 10,
        # The broker may come back empty (tansu keeps topics in memory): notice it quickly.
        "topic.metadata.refresh.interval.ms": 10000,
        **NO_METRICS_PUSH,
    }
    if on_error is not None:
        config["error_cb"] = on_error
    return config


def ensure_topics(
    bootstrap: str,
    topics: Sequence[str],
    partitions: int = 4,
    timeout: float = 10.0,
    *,
    retention_ms: int | None = None,
) -> None:
    """Create topics that do not exist yet (blocking; call from a thread in async code).

    They keep messages ``retention_ms`` (default: ``SUNDIAL_TOPIC_RETENTION_MS``, 7 days), which is how far
    back a replay can reach; an existing topic keeps its own setting.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=timeout).topics)
    if all(t in existing for t in topics):
        return
    # Read here rather than threaded through every caller: a topic is created once per pool, and the
    # worker's consumer that usually creates it knows nothing else of the settings.
    retention = CommonSettings().topic_retention_ms if retention_ms is None else retention_ms
    config = {"retention.ms": str(retention)}
    missing = [
        NewTopic(t, num_partitions=partitions, replication_factor=1, config=config) for t in topics if t not in existing
    ]
    if not missing:
        return
    for topic, future in admin.create_topics(missing, operation_timeout=timeout).items():
        try:
            future.result(timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
            log.debug("topic %s already exists", topic)


#: The marker topic of :class:`KafkaIncarnation`: one partition that always holds at least one message.
INCARNATION_TOPIC = "sundial.broker-incarnation"


class BrokerIncarnation(Protocol):
    def lost_its_data(self) -> bool | None:
        """Blocking. True if the broker no longer holds what it held at the last call (it restarted empty, or
        this is the first call and there is no sign of an earlier incarnation); False if it does; None if the
        broker did not answer."""
        ...

    def close(self) -> None: ...


class KafkaIncarnation:
    """Notices a broker that came back without its data (memory storage restarted, a new cluster, wiped disks).

    A marker topic is kept non-empty: when its high watermark reads 0 (or the topic is gone), every topic
    and offset went with it — every message published before is lost. That is the signal, rather than the
    cluster id (a broker can keep its configured id and lose its data) or the pools' own watermarks (a
    busy pool's recreated topic can pass its old offsets within seconds). A marker is then written again,
    so the next restart is noticed too. One watermark read per call.
    """

    def __init__(self, bootstrap: str, topic: str = INCARNATION_TOPIC, timeout_sec: float = 2.0) -> None:
        self.topic = topic
        self._bootstrap = bootstrap
        self._timeout = timeout_sec
        # Never subscribes nor commits: it only reads watermarks, so it joins no group.
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "sundial-incarnation",
                "enable.auto.commit": False,
                **NO_METRICS_PUSH,
            }
        )
        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 5000, **NO_METRICS_PUSH}
        )

    def lost_its_data(self) -> bool | None:
        try:
            # Fresh metadata first: the client's cached view of a topic it saw created a moment ago (or of one
            # the broker lost) is no answer; the broker's is. A consumer does not auto-create topics.
            topic = self._consumer.list_topics(self.topic, timeout=self._timeout).topics.get(self.topic)
            high = 0
            if topic is not None and topic.error is None and 0 in topic.partitions:
                _low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, 0), timeout=self._timeout, cached=False
                )
        except KafkaException as exc:
            log.debug("broker incarnation: %s unreadable: %r", self.topic, exc)
            return None
        if high > 0:
            return False
        try:
            ensure_topics(self._bootstrap, [self.topic], partitions=1, timeout=self._timeout)
        except KafkaException as exc:
            log.debug("broker incarnation: cannot create %s: %r", self.topic, exc)
            return None
        self._producer.produce(self.topic, b"marker")
        if self._producer.flush(self._timeout) > 0:
            log.warning("broker incarnation: the marker was not acknowledged; looking again next time")
        return True

    def close(self) -> None:
        self._producer.flush(self._timeout)
        self._consumer.close()
