"""Waking a pool's parked consumers when something was published to its topic.

The broker (Tansu) does not answer a parked fetch when a message arrives: measured, a consumer with
``fetch.wait.max.ms`` 5000 received a message produced mid-wait ~2 s later, and one with 10 ms costs the broker
~0.04 of a core idle (100 fetches/s). So an idle worker stops fetching altogether (it pauses its partitions:
:mod:`sundial_worker.consumer`) and a publisher says on Redis, after the broker acknowledged a batch, which topics
it wrote to; the topic's workers resume at once. :class:`WakingPublisher` wraps any publisher to do so.

Pub/sub is at most once: a parked worker also fetches on its own every second, so a lost wake-up (or a publisher
that does not announce) costs at most that.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence

from redis.asyncio import Redis
from redis.exceptions import RedisError

from sundial_common.broker.kafka import Publisher
from sundial_common.broker.messages import ExecutionMessage

log = logging.getLogger(__name__)


#: The least time between two wake-ups of one topic by one publisher; a worker stays awake longer than this after
#: its last message (``sundial_worker.admission.AdmissionConfig.idle_park_sec``).
WAKE_QUIET_SEC = 0.1


def topic_wake_channel(topic: str) -> str:
    return f"sundial:topic-wake:{topic}"


class WakingPublisher:
    """A :class:`~sundial_common.broker.kafka.Publisher` that announces the topics of each acknowledged batch.

    A topic announced less than ``min_interval_sec`` (:data:`WAKE_QUIET_SEC`) ago is not announced again: a worker
    woken then fetches for its poll timeout (250 ms) or, once it receives something, stays awake for its idle time
    (longer than this), so it receives this batch without another wake-up. In a dense stream that is most
    batches: a steady 1,500 a second published ~80 batches a second per dispatcher, each a Redis round trip and a
    message every worker read.
    """

    def __init__(
        self,
        inner: Publisher,
        redis: Redis,
        min_interval_sec: float = WAKE_QUIET_SEC,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inner = inner
        self._redis = redis
        self._min_interval_sec = min_interval_sec
        self._clock = clock
        #: When each topic was last announced (``clock``).
        self._announced: dict[str, float] = {}

    async def publish(self, messages: Sequence[ExecutionMessage]) -> list[Exception | None]:
        errors = await self._inner.publish(messages)
        now = self._clock()
        topics = {
            m.topic
            for m, e in zip(messages, errors, strict=True)
            if e is None and now - self._announced.get(m.topic, -math.inf) >= self._min_interval_sec
        }
        if topics:
            try:
                # One round trip for the batch, however many pools it went to.
                async with self._redis.pipeline(transaction=False) as pipe:
                    for topic in topics:
                        pipe.publish(topic_wake_channel(topic), b"")
                    await pipe.execute()
                self._announced.update(dict.fromkeys(topics, now))
            except (RedisError, OSError) as exc:  # the workers' own polls find the messages within a second
                log.debug("topic wake-ups not sent: %r", exc)
        return errors

    def warm(self, topics: Sequence[str]) -> None:
        """Blocking: the wrapped publisher's metadata warm-up, if it has one."""
        warm = getattr(self._inner, "warm", None)
        if warm is not None:
            warm(topics)

    async def close(self) -> None:
        await self._inner.close()
