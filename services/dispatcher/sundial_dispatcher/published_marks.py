"""The published marks a dispatcher process owes, for every shard it leads, written together.

``executions.published_at`` tells the sweeper a PENDING execution is waiting in Kafka rather than never sent.
A pass's sends are marked ``after_sec`` later, and only the rows still PENDING: by then a worker has started
nearly every one, and its start recorded the message's broker timestamp as ``published_at``, so the write
nearly always changes nothing — yet each call is planned over every partition of ``executions``. The marks of
all the shards a process leads therefore go in one statement, once the oldest has waited ``every_sec`` more:
at 50 due a second over eight shards, two statements a second rather than sixteen.

Marks still waiting when the process stops are dropped; the sweeper then sends those executions again if they
are still unstarted, and the start compare-and-swap drops the duplicate. A shard whose term ended keeps its marks
here: they are true (the messages were sent) whoever leads it next.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from uuid import UUID

from sundial_common.stores.dispatch import DispatchStore

__all__ = ["PublishedMarks"]


class PublishedMarks:
    """Published execution ids waiting to be marked: (monotonic time of the publish, ids), oldest first."""

    def __init__(
        self,
        store: DispatchStore,
        after_sec: float,
        every_sec: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.after_sec = after_sec
        #: How much longer than ``after_sec`` the oldest waits, for the company of later sends.
        self.grouped = min(every_sec, after_sec)
        self._clock = clock
        self._waiting: deque[tuple[float, Sequence[UUID]]] = deque()

    def add(self, ids: Sequence[UUID]) -> None:
        if ids:
            self._waiting.append((self._clock(), ids))

    def due_in(self) -> float | None:
        """Seconds until :meth:`write_due` has marks to write (None: none wait)."""
        if not self._waiting:
            return None
        return max(self._waiting[0][0] + self.after_sec + self.grouped - self._clock(), 0.0)

    async def write_due(self) -> None:
        """Mark, in one statement, every send ``after_sec`` old, once the oldest is ``after_sec`` + ``every_sec``
        old. The ids are taken before the write: a pass of another shard meanwhile finds none of them."""
        horizon = self._clock() - self.after_sec
        if not self._waiting or self._waiting[0][0] > horizon - self.grouped:
            return
        due: list[UUID] = []
        while self._waiting and self._waiting[0][0] <= horizon:
            due += self._waiting.popleft()[1]
        await self.store.mark_published(due)
