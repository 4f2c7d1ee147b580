"""Waking a sleeping shard leader when a member due before its planned wake is added to its hot window.

A leader's pass loop sleeps until the earliest member of its window is due, at most
:data:`~sundial_common.hotwindow.window.WAKE_HORIZON_SEC` (:mod:`sundial_dispatcher.shards`). Writers announce members
due sooner than that on :data:`~sundial_common.hotwindow.window.WAKE_CHANNEL`
(:mod:`sundial_common.hotwindow.window`); one
subscription per dispatcher process (:class:`WakeListener`) hands each announcement to the leader of its shard
(:class:`Alarm`), which wakes only if the member is due before it planned to look.

Pub/sub is at most once: while the subscription is down (Redis away, reconnecting) an announcement is lost and
its member waits for the leader's next look, at most the horizon later. Nothing else depends on it.
"""

from __future__ import annotations

import asyncio
import logging
import math

from redis.asyncio import Redis
from redis.exceptions import RedisError
from sundial_common.hotwindow.window import WAKE_CHANNEL

log = logging.getLogger(__name__)

#: Longest wait before subscribing again after the subscription failed.
_MAX_RETRY_SEC = 2.0
_READ_SEC = 1.0


class Alarm:
    """One shard leader's wake-up: ``planned`` is when (epoch ms) it means to look next; ``ring`` wakes it.

    ``awake()`` before each claim: anything announced from then on rings, so a member added while the pass runs
    (after its claim read the window) still cuts the following sleep short.
    """

    def __init__(self) -> None:
        self.ring = asyncio.Event()
        self.planned = math.inf

    def awake(self) -> None:
        self.ring.clear()
        self.planned = math.inf

    def plan(self, at_ms: float) -> None:
        """Sleep until ``at_ms``: from now on only members due before it ring (a ring already set stays set)."""
        self.planned = at_ms

    def added(self, due_ms: float) -> None:
        if due_ms < self.planned:
            self.planned = due_ms
            self.ring.set()


class WakeListener:
    """The process's one subscription to the wake channel; ``run(stop)`` until stopped."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._alarms: dict[int, Alarm] = {}
        #: Set while subscribed: without it, leaders look at their windows on their poll interval instead.
        self.listening = False

    def alarm(self, shard: int) -> Alarm:
        """The alarm of ``shard``'s leader (one per shard; a new term takes over the old one's)."""
        return self._alarms.setdefault(shard, Alarm())

    async def run(self, stop: asyncio.Event) -> None:
        failures = 0
        while not stop.is_set():
            try:
                await self._listen(stop)
                return
            except (RedisError, OSError) as exc:
                self.listening = False
                failures += 1
                delay = min(0.1 * 2**failures, _MAX_RETRY_SEC)
                log.warning("hot window wake-ups: subscription lost (%r); subscribing again in %.1fs", exc, delay)
                # Members announced meanwhile are lost: wake every leader once so it looks at its window now.
                for alarm in self._alarms.values():
                    alarm.added(-math.inf)
                await asyncio.sleep(delay)

    async def _listen(self, stop: asyncio.Event) -> None:
        async with self._redis.pubsub(ignore_subscribe_messages=True) as pubsub:
            await pubsub.subscribe(WAKE_CHANNEL)
            self.listening = True
            try:
                while not stop.is_set():
                    # Bounded, so the loop notices a stop within a second.
                    message = await pubsub.get_message(timeout=_READ_SEC)
                    if message is not None:
                        self._deliver(message["data"])
            finally:
                self.listening = False

    def _deliver(self, data: bytes | str) -> None:
        try:
            shard, due_ms = (data.decode() if isinstance(data, bytes) else data).split()
            alarm = self._alarms.get(int(shard))
            if alarm is not None:
                alarm.added(float(due_ms))
        except ValueError:
            log.warning("hot window wake-ups: ignoring %r", data)
