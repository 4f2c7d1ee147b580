"""The published marks of a dispatcher process's shards: written together, once the oldest has waited a little
longer than the marking delay, in one statement for every shard."""

from __future__ import annotations

from typing import cast
from uuid import UUID, uuid4

import pytest
from sundial_common.stores.dispatch import DispatchStore
from sundial_dispatcher.published_marks import PublishedMarks


class Outbox:
    def __init__(self) -> None:
        self.written: list[list[UUID]] = []

    async def mark_published(self, execution_ids: list[UUID]) -> None:
        self.written.append(list(execution_ids))


async def test_marks_are_written_together_once_the_oldest_has_waited_a_little_longer() -> None:
    outbox, now = Outbox(), [100.0]
    marks = PublishedMarks(cast(DispatchStore, outbox), 1.0, 0.5, clock=lambda: now[0])
    passes = [[uuid4()] for _ in range(4)]
    for i, ids in enumerate(passes):  # a pass every 0.2 s publishes one execution
        now[0] = 100.0 + 0.2 * i
        marks.add(ids)
    now[0] = 101.2
    assert marks.due_in() == pytest.approx(0.3)
    await marks.write_due()
    assert outbox.written == [], "the oldest has waited 1.2 s: not yet"
    now[0] = 101.5
    await marks.write_due()
    assert outbox.written == [passes[0] + passes[1] + passes[2]], "one statement for everything published 1 s ago"
    assert marks.due_in() == pytest.approx(0.6), "the last send (100.6) is marked 1.5 s after it"


async def test_the_shards_of_a_process_share_one_statement_and_never_write_a_mark_twice() -> None:
    outbox, now = Outbox(), [100.0]
    marks = PublishedMarks(cast(DispatchStore, outbox), 1.0, 0.5, clock=lambda: now[0])
    shards = [[uuid4(), uuid4()] for _ in range(4)]
    for ids in shards:  # four shards publish in the same instant
        marks.add(ids)
    marks.add([])
    now[0] = 101.5
    for _ in shards:  # each shard's next pass writes what is due: only the first finds any
        await marks.write_due()
    assert outbox.written == [[i for ids in shards for i in ids]]
    assert marks.due_in() is None
