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
        self.marked: list[list[int]] = []  # the partitions given a marker, per read that gave any

    def _read(self, pool: str) -> tuple[dict[int, int], datetime, dict[int, int]]:
        return self.reads.pop(0)

    def _mark(self, pool: str, partitions: list[int]) -> None:
        self.marked.append(partitions)


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


def test_partitions_that_stay_quiet_get_a_marker_and_the_horizon_passes_the_bursts_last_messages() -> None:
    # A burst's last batches: partition 0's at base 9 (three messages, watermark 10), partition 1's at 4 (watermark 5);
    # the group has acknowledged them all. Nothing more comes: no later batch to pass them by, until the markers.
    consumed = Scripted(
        [
            ({0: 12, 1: 5}, at(2), {0: 10, 1: 5}),
            ({0: 12, 1: 5}, at(4), {0: 10, 1: 5}),  # quiet for a pass, the group at the last batch: markers (12, 5)
            ({0: 13, 1: 6}, at(6), {0: 13, 1: 6}),  # the workers acknowledged the markers too
        ]
    )

    assert [consumed.horizon("p", wanted=at(1)) for _ in range(3)] == [None, None, at(4)]
    assert consumed.marked == [[0, 1]]


def test_no_marker_where_messages_flow_or_the_group_is_behind() -> None:
    consumed = Scripted(
        [
            ({0: 3, 1: 5, 2: 7}, at(2), {0: 10, 1: 5, 2: 8}),
            ({0: 3, 1: 5, 2: 9}, at(4), {0: 10, 1: 5, 2: 10}),  # 0: quiet, group behind; 1: quiet, at it; 2: flowing
            ({0: 3, 1: 5, 2: 12}, at(6), {0: 10, 1: 6, 2: 13}),  # 1: its marker, not yet acknowledged: not quiet
        ]
    )

    assert [consumed.horizon("p", wanted=at(1)) for _ in range(3)] == [None, None, None]
    assert consumed.marked == [[1]]


def test_no_marker_when_the_horizon_reaches_what_is_wanted_or_the_read_is_not_past_it() -> None:
    reads = [({0: 10}, at(2), {0: 10}), ({0: 10}, at(4), {0: 10}), ({0: 10}, at(6), {0: 10})]
    not_past = Scripted(list(reads))
    without = Scripted(list(reads))

    assert [not_past.horizon("p", wanted=at(7)) for _ in range(3)] == [None, None, None]
    assert [without.horizon("p") for _ in range(3)] == [None, None, None]
    assert not_past.marked == without.marked == []
