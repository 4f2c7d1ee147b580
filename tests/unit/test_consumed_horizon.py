"""The instant before which a pool's consumer group has acknowledged every message (``sundial_sweeper.consumed``),
from scripted reads of its committed offsets and the topic's watermarks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sundial_sweeper.consumed import ConsumedHorizon

T0 = datetime(2026, 11, 27, tzinfo=UTC)


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


class Scripted(ConsumedHorizon):
    """Each read returns the next (committed offsets, instant, high watermarks)."""

    def __init__(self, reads: list[tuple[dict[int, int], datetime, dict[int, int]]]) -> None:
        super().__init__("unused:9092")
        self.reads = reads

    def _read(self, pool: str) -> tuple[dict[int, int], datetime, dict[int, int]]:
        return self.reads.pop(0)


def test_the_horizon_is_the_last_instant_whose_watermarks_the_group_has_reached() -> None:
    consumed = Scripted(
        [
            ({0: 0, 1: 0}, at(0), {0: 10, 1: 5}),  # the group behind: no horizon yet
            ({0: 10, 1: 4}, at(2), {0: 20, 1: 9}),  # partition 1 one short of the first sample
            ({0: 12, 1: 5}, at(4), {0: 30, 1: 9}),  # the first sample reached: everything before 0 s acknowledged
            ({0: 30, 1: 9}, at(6), {0: 30, 1: 9}),  # caught up with everything: the read's own instant
        ]
    )

    assert [consumed.horizon("p") for _ in range(4)] == [None, None, at(0), at(6)]


def test_a_group_that_stopped_keeps_the_horizon_where_it_was() -> None:
    consumed = Scripted(
        [
            ({0: 10}, at(0), {0: 10}),
            ({0: 10}, at(2), {0: 50}),
            ({0: 10}, at(4), {0: 90}),
        ]
    )

    assert [consumed.horizon("p") for _ in range(3)] == [at(0), at(0), at(0)]


def test_a_broker_that_lost_its_data_starts_the_samples_again() -> None:
    consumed = Scripted(
        [
            ({0: 0}, at(0), {0: 100}),
            ({0: 500}, at(2), {0: 3}),  # committed past the end: the old group's offsets tell nothing
            ({0: 0}, at(4), {0: 3}),  # the watermark went back from 100: the first sample is no use
            ({0: 3}, at(6), {0: 8}),
        ]
    )

    assert [consumed.horizon("p") for _ in range(4)] == [None, None, None, at(4)]
