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


def test_the_horizon_is_the_last_instant_below_whose_later_messages_the_group_has_come() -> None:
    consumed = Scripted(
        [
            ({0: 0, 1: 0}, at(0), {0: 10, 1: 5}),  # the group behind
            ({0: 10, 1: 4}, at(2), {0: 20, 1: 9}),  # partition 1 short of 8, the offset below its later watermark
            ({0: 19, 1: 8}, at(4), {0: 30, 1: 12}),  # past 19 and 8: everything appended before 0 s acknowledged
            ({0: 29, 1: 11}, at(6), {0: 40, 1: 14}),  # past 29 and 11, appended after 2 s: the horizon moves on
        ]
    )

    assert [consumed.horizon("p") for _ in range(4)] == [None, None, at(0), at(2)]


def test_a_watermark_is_not_taken_as_the_end_of_the_partition() -> None:
    # Tansu's watermark after one batch of 10 messages at offset 0 is 1: a group committed at 1 has acknowledged only
    # the first of them, and one at 10 all; only a later batch (base offset 10, watermark 11) tells them apart.
    consumed = Scripted(
        [
            ({0: 1}, at(0), {0: 1}),
            ({0: 1}, at(2), {0: 1}),
            ({0: 1}, at(4), {0: 11}),
            ({0: 10}, at(6), {0: 11}),
        ]
    )

    assert [consumed.horizon("p") for _ in range(4)] == [None, None, None, at(2)]


def test_a_group_that_stopped_keeps_the_horizon_where_it_was() -> None:
    consumed = Scripted(
        [
            ({0: 0}, at(0), {0: 10}),
            ({0: 20}, at(2), {0: 21}),
            ({0: 20}, at(4), {0: 50}),
            ({0: 20}, at(6), {0: 90}),
        ]
    )

    assert [consumed.horizon("p") for _ in range(4)] == [None, at(0), at(0), at(0)]


def test_a_broker_that_lost_its_data_starts_the_samples_again() -> None:
    consumed = Scripted(
        [
            ({0: 0}, at(0), {0: 100}),
            ({0: 0}, at(2), {0: 3}),  # the watermark went back from 100: the first sample is no use
            ({0: 0}, at(4), {0: 5}),
            ({0: 4}, at(6), {0: 8}),  # past 4, the offset below the watermark read after 2 s
        ]
    )

    assert [consumed.horizon("p") for _ in range(4)] == [None, None, None, at(2)]
