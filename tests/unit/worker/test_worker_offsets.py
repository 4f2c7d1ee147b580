"""The worker commits a partition's offset only past messages whose Postgres write is done."""

from __future__ import annotations

import random

from sundial_worker.offsets import OffsetTracker

P0 = ("sundial.pool.demo", 0)
P1 = ("sundial.pool.demo", 1)


def test_nothing_is_committable_while_the_first_message_runs() -> None:
    tracker = OffsetTracker()
    for offset in (10, 11, 12):
        tracker.add(P0, offset)
    tracker.done(P0, 11)
    tracker.done(P0, 12)
    assert tracker.committable() == {}
    tracker.done(P0, 10)
    # Kafka's committed offset is the next one to read.
    assert tracker.committable() == {P0: 13}


def test_commit_stops_at_the_first_unfinished_message() -> None:
    tracker = OffsetTracker()
    for offset in range(5):
        tracker.add(P0, offset)
    for offset in (0, 1, 3, 4):
        tracker.done(P0, offset)
    assert tracker.committable() == {P0: 2}
    assert tracker.pending(P0) == 1


def test_partitions_are_independent() -> None:
    tracker = OffsetTracker()
    tracker.add(P0, 0)
    tracker.add(P1, 7)
    tracker.done(P1, 7)
    assert tracker.committable() == {P1: 8}


def test_a_committed_position_is_not_offered_again_until_it_moves() -> None:
    tracker = OffsetTracker()
    tracker.add(P0, 0)
    tracker.done(P0, 0)
    positions = tracker.committable()
    tracker.mark_committed(positions)
    assert tracker.committable() == {}
    tracker.add(P0, 1)
    tracker.done(P0, 1)
    assert tracker.committable() == {P0: 2}


def test_a_failed_commit_is_offered_again() -> None:
    tracker = OffsetTracker()
    tracker.add(P0, 0)
    tracker.done(P0, 0)
    positions = tracker.committable()
    tracker.mark_committed(positions)
    tracker.mark_uncommitted(positions)
    assert tracker.committable() == {P0: 1}


def test_a_revoked_partition_is_forgotten_and_late_completions_are_ignored() -> None:
    tracker = OffsetTracker()
    tracker.add(P0, 0)
    tracker.add(P0, 1)
    tracker.done(P0, 0)
    tracker.forget([P0])
    tracker.done(P0, 1)  # the handler finished after the revoke: its offset is the new owner's business
    assert tracker.committable() == {}
    assert tracker.partitions() == []


def test_replayed_offsets_do_not_hold_the_position_back_or_move_it() -> None:
    tracker = OffsetTracker()
    for offset in (0, 1, 2):
        tracker.add(P0, offset)
    tracker.done(P0, 0)
    # A seek back replays 0..2: 0 is settled, 1 and 2 are still guarded by their first delivery.
    for offset in (0, 1, 2):
        tracker.add(P0, offset)
    tracker.done(P0, 0)  # the replay of a settled offset changes nothing
    assert tracker.committable() == {P0: 1}
    tracker.done(P0, 1)
    tracker.done(P0, 2)
    assert tracker.committable() == {P0: 3}
    assert tracker.pending(P0) == 0


def test_gaps_in_offsets_are_fine() -> None:
    # Compacted topics and transaction markers leave holes in the offset sequence.
    tracker = OffsetTracker()
    tracker.add(P0, 3)
    tracker.add(P0, 9)
    tracker.done(P0, 9)
    assert tracker.committable() == {}
    tracker.done(P0, 3)
    assert tracker.committable() == {P0: 10}


def test_random_completion_order_never_commits_past_an_unfinished_message() -> None:
    rng = random.Random(7)
    tracker = OffsetTracker()
    offsets = list(range(200))
    for offset in offsets:
        tracker.add(P0, offset)
    order = offsets[:]
    rng.shuffle(order)
    finished: set[int] = set()
    for offset in order:
        tracker.done(P0, offset)
        finished.add(offset)
        first_unfinished = next((o for o in offsets if o not in finished), 200)
        assert tracker.committable().get(P0, 0) == first_unfinished
    assert tracker.committable() == {P0: 200}
