"""Messages published ahead of their due instant, held until it comes.

The dispatcher may publish an execution up to ``SUNDIAL_DISPATCHER_PUBLISH_LEAD_MS`` before it is due (the message
then carries ``due_at``), so that its dispatch pass, the produce and the worker's fetch are done before the due
instant rather than after it. The worker keeps such a message here until just before ``due_at`` (``lead_sec``), then
claims it with the start CAS together with the held messages due within ``gather_sec`` after it, and launches each
handler at its own instant: the CAS's round trip is done before the instant rather than after it, and a spread stream
pays one start transaction for several executions. Nothing starts before it is due: the claim records the launch
instant as ``started_at`` (the later of it and the CAS's ``now()``), and the handler is called at that instant.

A held message takes no handler slot: a message already due never waits behind held ones, and when a held one comes back
it takes a slot like any other, from its claim until its handler ends (first, before the loop takes more from Kafka). At
most ``cap`` are held at once; beyond that the admission loop takes nothing more from Kafka, as when every slot is busy.
A held message is not acknowledged, so its offset is not committed before its execution's outcome is written (or its CAS
lost), as for any message; a worker that stops leaves it unacknowledged for the group's next member. A cancel of the
execution while it is held makes its start CAS lose (the row is no longer PENDING), as for any message; a cancel between
the claim and the launch reaches the handler as it starts, as for any running one.

Only the timing lives here; :class:`~sundial_worker.admission.Admission` decides what is held and claims what comes due.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Holding(Generic[T]):
    """Items kept until their due instant (epoch seconds), earliest first; ``run`` calls ``on_due`` as they come due."""

    def __init__(
        self,
        cap: int,
        on_due: Callable[[], None],
        clock: Callable[[], float] = time.time,
        *,
        lead_sec: float = 0.0,
        gather_sec: float = 0.0,
    ) -> None:
        self.cap = cap
        #: An item comes back this long before its instant (its claim is then done by the instant).
        self.lead_sec = lead_sec
        #: What comes due within this after the earliest item comes back with it (one claim for several).
        self.gather_sec = gather_sec
        self._on_due = on_due
        self._clock = clock
        self._heap: list[tuple[float, int, T]] = []
        self._order = itertools.count()
        #: Set when an item is held earlier than the timer was armed for.
        self._changed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._heap)

    def full(self) -> bool:
        return len(self._heap) >= self.cap

    def hold(self, due: float, item: T) -> None:
        if not self._heap or due < self._heap[0][0]:
            self._changed.set()
        heapq.heappush(self._heap, (due, next(self._order), item))

    def holds(self, due: float) -> bool:
        """Whether an item due at ``due`` is to be held (its time to come back is still to come)."""
        return due - self.lead_sec > self._clock()

    def due(self, most: int) -> list[T]:
        """Up to ``most`` items whose time to come back has come, with those due within the gather after the
        earliest of them, earliest first (they are no longer held)."""
        now = self._clock()
        taken: list[T] = []
        if not self._heap or self._heap[0][0] - self.lead_sec > now:
            return taken
        until = self._heap[0][0] + self.gather_sec
        while self._heap and len(taken) < most and self._heap[0][0] <= until:
            taken.append(heapq.heappop(self._heap)[2])
        if taken:  # the timer re-arms for what is left
            self._changed.set()
        return taken

    def waiting(self) -> bool:
        """Whether an item's time to come back has come and it is still held (no slot took it yet)."""
        return bool(self._heap) and self._heap[0][0] - self.lead_sec <= self._clock()

    def drain(self) -> list[T]:
        """Everything still held (stopping: left unacknowledged for the group's next member)."""
        items = [entry[2] for entry in self._heap]
        self._heap.clear()
        return items

    async def run(self, stopping: asyncio.Event) -> None:
        """Call ``on_due`` ``lead_sec`` before each held item's instant until ``stopping`` (which ``wake`` makes it
        notice)."""
        while not stopping.is_set():
            self._changed.clear()
            timeout = None
            if self._heap:
                timeout = self._heap[0][0] - self.lead_sec - self._clock()
                if timeout <= 0:
                    self._on_due()
                    if self.waiting():  # no room for all of it: the admission loop takes the rest as slots free
                        timeout = None
                    else:
                        continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)

    def wake(self) -> None:
        self._changed.set()
