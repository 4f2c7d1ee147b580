"""The worker's wake-up subscription: a publisher announced its pool's topic, so a parked consumer fetches now.

One Redis pub/sub subscription to :func:`~sundial_common.broker.wakeups.topic_wake_channel` of the consumer's
topic (task ``wakes``). Admission parks the consumer (no broker fetches) only while :attr:`TopicWakes.listening`:
with the subscription down, an idle worker fetches as it always did, so nothing waits on a signal that cannot come.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from redis.asyncio import Redis
from redis.exceptions import RedisError
from sundial_common.broker.wakeups import topic_wake_channel

log = logging.getLogger("sundial.worker")

_MAX_RETRY_SEC = 2.0
_READ_SEC = 1.0


class TopicWakes:
    """Calls ``on_wake`` for every announcement on ``topic``'s wake channel; ``run(stopping)`` until stopping."""

    def __init__(self, redis: Redis, topic: str, on_wake: Callable[[], None]) -> None:
        self._redis = redis
        self._channel = topic_wake_channel(topic)
        self._on_wake = on_wake
        self.listening = False

    async def run(self, stopping: asyncio.Event) -> None:
        failures = 0
        while not stopping.is_set():
            try:
                await self._listen(stopping)
            except (RedisError, OSError) as exc:
                self.listening = False
                failures += 1
                delay = min(0.1 * 2**failures, _MAX_RETRY_SEC)
                log.warning("topic wake-ups: subscription lost (%r); subscribing again in %.1fs", exc, delay)
                self._on_wake()  # what was announced meanwhile is lost: fetch now
                await asyncio.sleep(delay)

    async def _listen(self, stopping: asyncio.Event) -> None:
        async with self._redis.pubsub(ignore_subscribe_messages=True) as pubsub:
            await pubsub.subscribe(self._channel)
            self.listening = True
            try:
                while not stopping.is_set():
                    # Bounded: a read without a timeout would meet the client's socket timeout, and the loop notices
                    # a stop within a second.
                    if await pubsub.get_message(timeout=_READ_SEC) is not None:
                        self._on_wake()
            finally:
                self.listening = False
