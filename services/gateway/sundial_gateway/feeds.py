"""A pool's messages for the gateway's callers: a consumer that is in the group only while some caller pulls.

One :class:`Feed` per (pool, group) this gateway serves. A pull holds the feed only while it takes messages (one
take at a time: the consumer is one), joining the consumer group if it is not in it; a take waits (within the pull's
wait) for a first message due now and returns it with whatever else is due and already fetched, up to ``max`` — it
never waits to fill ``max``. The start compare-and-swap then runs outside the feed, so concurrent pulls of one pool
start their batches side by side.

**Published ahead.** The dispatcher may publish a message before its due instant (the message carries ``due_at``).
The feed holds such a message, outside any pull and with its offset in flight, until that instant (plus
``_HELD_GATHER_SEC``, so that what comes due meanwhile goes with it), and the take waiting then hands it out: nothing
starts before it is due, and a message due now never waits behind one due later in the same fetch. A message due
further ahead than ``_MAX_HOLD_SEC`` is handed out at once. Held messages are dropped with the consumer when the feed
leaves the group (their offsets were not committed: the group's next member gets them).

Once a batch's executions are started (or their start lost), :meth:`Feed.commit` commits past them — but never past
a message another pull took (or the feed holds) and has not decided yet (per partition, the commit stops at the
lowest offset still in flight; :meth:`Feed.forget` drops a batch whose start failed): from then on a RUNNING row and
its liveness key, renewed by the worker's heartbeats, are what keep the execution alive, as for a direct worker
whose redelivered message loses the start compare-and-swap. **No stranded work**: :meth:`Feed.leave_if_idle` (the
gateway's janitor, twice a second) closes the consumer — leaving the group, so its partitions move to members that
have callers — once no caller has pulled or heartbeated for ``leave_after_sec``; a gateway with no caller holds no
partition.

The group: an owned pool's gateways join the pool's own group (:func:`~sundial_common.broker.messages.pool_group`),
alongside any direct worker, so the sweeper's view of what the group has passed holds. A shared pool's token takes
one tenant's work only, so each sharing tenant's gateways form a group of their own that reads the whole topic and
skips the other tenants' messages (their payloads are never opened).

confluent-kafka blocks, and a consumer must be used from one thread: every call runs on the feed's own thread.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from sundial_common.broker.kafka import ensure_topics, pool_consumer_config
from sundial_common.broker.messages import pool_group, pool_topic

log = logging.getLogger("sundial.gateway")

_T = TypeVar("_T")
#: One consume call's longest wait: how often a long poll looks at its deadline.
_SLICE_SEC = 0.25
#: The longest a message published ahead of its due instant is held (the dispatcher's lead is far shorter; a message
#: due later than this is handed out at once rather than hold a partition's commits).
_MAX_HOLD_SEC = 5.0
#: A held message is handed out this long after the earliest held one comes due, with what came due meanwhile: one
#: pull and one start for several at the cost of at most this much lateness each (the direct worker's gather).
_HELD_GATHER_SEC = 0.008
#: Most messages held at once: beyond it, a take fetches nothing more until some come due.
_HOLD_CAP = 4096

#: A message's due instant (epoch seconds), or None if it is due now (or cannot be read: its pull skips it).
DueOf = Callable[[Message], float | None]


def _due_now(_message: Message) -> float | None:
    return None


def feed_group(pool: str, tenant: str, *, shared: bool) -> str:
    """The consumer group of a pool's gateways serving ``tenant`` (see the module docstring)."""
    return f"{pool_group(pool)}.tenant.{tenant}" if shared else pool_group(pool)


class Feed:
    """One pool's consumer for one group, in the group only while pulls wait on it."""

    def __init__(
        self,
        bootstrap: str,
        pool: str,
        group: str,
        *,
        client_id: str,
        session_timeout_sec: float,
        due_of: DueOf = _due_now,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.pool = pool
        self.topic = pool_topic(pool)
        self.group = group
        self.bootstrap = bootstrap
        self._clock = clock
        self._wall = wall
        self._due_of = due_of
        #: Messages published ahead of their due instant: (due, order, message), earliest first.
        self._ahead: list[tuple[float, int, Message]] = []
        self._order = itertools.count()
        self._config = pool_consumer_config(
            bootstrap, group, client_id=client_id, session_timeout_sec=session_timeout_sec
        )
        #: Held by the pull taking messages (the consumer is used by one take at a time).
        self.lock = asyncio.Lock()
        #: Per partition: offsets taken by pulls whose start is not decided yet, and the end of those decided.
        self._in_flight: dict[int, set[int]] = {}
        self._decided: dict[int, int] = {}
        #: Pulls waiting for or holding :attr:`lock`.
        self.waiting = 0
        self._last_pull = clock()
        self._consumer: Consumer | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sundial-gateway-{pool}")

    @property
    def joined(self) -> bool:
        return self._consumer is not None

    def touch(self) -> None:
        self._last_pull = self._clock()

    @property
    def held(self) -> int:
        """Messages held for their due instant."""
        return len(self._ahead)

    async def take(self, most: int, deadline: Callable[[], float]) -> list[Message]:
        """Up to ``most`` messages due now, waiting until ``deadline()`` (monotonic) for a first one; those published
        ahead of their due instant are held meanwhile. Hold :attr:`lock`."""
        if self._consumer is None:
            await self._call(self._join)
        while True:
            due = self._release(most)
            if due:
                return due
            # A take fetches at least once, even with no wait left (``waitMs`` 0: what is there now).
            remaining = max(0.0, deadline() - self._clock())
            wait = min(_SLICE_SEC, remaining)
            if self._ahead:
                wait = min(wait, max(0.0, self._ahead[0][0] + _HELD_GATHER_SEC - self._wall()))
            if len(self._ahead) >= _HOLD_CAP:
                fetched: list[Message] = []
                await asyncio.sleep(wait)
            else:
                fetched = await self._call(self._consume, most, wait)
            for partition, offset in _positions(fetched):
                self._in_flight.setdefault(partition, set()).add(offset)
            now = self._wall()
            ready = []
            for message in fetched:
                at = self._due_of(message)
                if at is not None and 0 < at - now <= _MAX_HOLD_SEC:
                    heapq.heappush(self._ahead, (at, next(self._order), message))
                else:
                    ready.append(message)
            if ready or remaining <= 0:
                return ready + self._release(most - len(ready), gathered=False)

    def _release(self, most: int, *, gathered: bool = True) -> list[Message]:
        """Held messages now due, earliest first, up to ``most``. ``gathered``: only once the earliest has been due
        for ``_HELD_GATHER_SEC`` (or the take has nothing else to hand out)."""
        if not self._ahead or most <= 0:
            return []
        now = self._wall()
        if gathered and self._ahead[0][0] + _HELD_GATHER_SEC > now:
            return []
        out: list[Message] = []
        while self._ahead and len(out) < most and self._ahead[0][0] <= now:
            out.append(heapq.heappop(self._ahead)[2])
        return out

    async def commit(self, messages: list[Message]) -> None:
        """Commit past ``messages`` (their starts decided), up to the first message of each partition another pull
        has in flight. A failed commit is only logged: the messages come again and their start compare-and-swap
        loses."""
        ends: dict[int, int] = {}
        for partition, offset in _positions(messages):
            self._in_flight.get(partition, set()).discard(offset)
            self._decided[partition] = max(self._decided.get(partition, -1), offset + 1)
            in_flight = self._in_flight.get(partition)
            ends[partition] = min(in_flight) if in_flight else self._decided[partition]
        if ends and self._consumer is not None:
            await self._call(self._commit, ends)

    def forget(self, messages: list[Message]) -> None:
        """Drop ``messages`` from those in flight without committing past them (their start failed): a later batch's
        commit passes them, and the sweeper sends again what stays PENDING."""
        for partition, offset in _positions(messages):
            self._in_flight.get(partition, set()).discard(offset)

    async def leave_if_idle(self, leave_after_sec: float) -> bool:
        """Leave the group if no pull has waited for ``leave_after_sec``; whether it left."""
        if self._consumer is None or self.waiting or self._clock() - self._last_pull < leave_after_sec:
            return False
        async with self.lock:
            if self.waiting:
                return False
            await self._call(self._leave)
        log.info("left group %s of %s: no caller pulls", self.group, self.topic)
        return True

    async def close(self) -> None:
        try:
            await self._call(self._leave)
        finally:
            self._thread.shutdown(wait=False)

    # --- on the feed's thread ----------------------------------------------------------------

    async def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _join(self) -> None:
        ensure_topics(self.bootstrap, [self.topic])
        consumer = Consumer(self._config)
        consumer.subscribe([self.topic])
        self._consumer = consumer
        log.info("joined group %s of %s: a caller pulls", self.group, self.topic)

    def _consume(self, most: int, wait_sec: float) -> list[Message]:
        assert self._consumer is not None
        # consume(n, t) waits until n messages or t elapsed, whichever comes first: wait for one message (low
        # latency), then take whatever else is already fetched (batching), as the direct worker does.
        messages = self._consumer.consume(num_messages=1, timeout=wait_sec)
        if messages and most > 1:
            messages.extend(self._consumer.consume(num_messages=most - 1, timeout=0))
        out = []
        for message in messages:
            error = message.error()
            if error is None:
                out.append(message)
            elif error.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error on %s: %s", self.topic, error)
        return out

    def _commit(self, ends: dict[int, int]) -> None:
        assert self._consumer is not None
        try:
            # Not waited for: a commit that fails only makes the messages come again, to lose the start CAS.
            self._consumer.commit(
                offsets=[TopicPartition(self.topic, p, o) for p, o in ends.items()], asynchronous=True
            )
        except KafkaException as exc:
            log.warning("committing %s offsets failed (their messages come again): %s", self.topic, exc)

    def _leave(self) -> None:
        consumer, self._consumer = self._consumer, None
        self._in_flight.clear()  # a member that joins again starts from the group's committed offsets
        self._decided.clear()
        self._ahead.clear()  # held, not committed: the group's next member gets them
        if consumer is not None:
            consumer.close()  # leaves the group: the partitions move to another member at once


def _positions(messages: list[Message]) -> list[tuple[int, int]]:
    positions = []
    for message in messages:
        partition, offset = message.partition(), message.offset()
        if partition is not None and offset is not None:
            positions.append((partition, offset))
    return positions
