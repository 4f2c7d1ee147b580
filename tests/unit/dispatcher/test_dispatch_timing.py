"""When a shard leader looks at its window next (sundial_dispatcher.shards.idle_wait), what wakes it early, and that
it wakes for its published marks."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import cast
from uuid import uuid4

import pytest
from sundial_common.hotwindow.window import WAKE_HORIZON_SEC
from sundial_common.stores.dispatch import DispatchStore
from sundial_common.stores.types import Occurrence
from sundial_common.testing import FakeClock
from sundial_dispatcher.dispatcher import DispatcherConfig, ShardDispatcher
from sundial_dispatcher.fairness import FairDispatch, FairnessConfig, FairQueue, Waiting
from sundial_dispatcher.group_commit import on_grid
from sundial_dispatcher.published_marks import PublishedMarks
from sundial_dispatcher.shards import dense_wait, idle_wait
from sundial_dispatcher.wakes import Alarm

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_leader_sleeps_until_the_next_due_member_and_no_longer_than_the_horizon() -> None:
    assert idle_wait(NOW, NOW + timedelta(milliseconds=200), 10.0, 0.05, True) == pytest.approx(0.201)
    assert idle_wait(NOW, NOW + timedelta(hours=1), 10.0, 0.05, True) == WAKE_HORIZON_SEC
    assert idle_wait(NOW, None, 10.0, 0.05, True) == WAKE_HORIZON_SEC


def test_without_wake_ups_a_leader_looks_every_poll_interval() -> None:
    assert idle_wait(NOW, None, 10.0, 0.05, False) == 0.05
    assert idle_wait(NOW, NOW + timedelta(seconds=5), 10.0, 0.05, False) == 0.05


def test_a_member_that_came_due_during_the_pass_is_claimed_at_once_and_side_work_bounds_the_sleep() -> None:
    assert idle_wait(NOW, NOW, 10.0, 0.05, True) == 0.0
    assert idle_wait(NOW, NOW - timedelta(milliseconds=10), 10.0, 0.05, True) == 0.0
    assert idle_wait(NOW, NOW - timedelta(milliseconds=10), 10.0, 0.05, False) == 0.0
    assert idle_wait(NOW, None, 0.3, 0.05, True) == 0.3
    assert idle_wait(NOW, None, -1.0, 0.05, True) == 0.0


def test_dense_shards_of_a_process_pass_at_the_same_instants_and_an_overrun_pass_is_followed_at_once() -> None:
    config = DispatcherConfig()  # 50 ms polls; dense passes take ~32 members, at most 100 ms apart
    # 312 members a second (a steady 2,500 a second over 8 shards): every 100 ms, on the grid, whenever each pass began.
    ends = [start + 0.004 + dense_wait(312.0, start, start + 0.004, config) for start in (10.003, 10.041, 10.077)]
    assert ends == [pytest.approx(10.1)] * 3
    # 625 a second: every 50 ms (32 / 625 = 51 ms, in whole poll intervals).
    assert 20.012 + dense_wait(625.0, 20.01, 20.012, config) == pytest.approx(20.05)
    assert dense_wait(312.0, 30.0, 30.15, config) == 0.0, "a pass longer than the spacing: the next at once"


async def test_an_alarm_rings_for_members_due_before_the_planned_look_only() -> None:
    alarm = Alarm()
    alarm.awake()
    alarm.plan(1_000)
    alarm.added(2_000)
    assert not alarm.ring.is_set()
    alarm.added(500)
    assert alarm.ring.is_set()
    await asyncio.wait_for(alarm.ring.wait(), 1)


def test_sparse_shards_of_a_process_wake_on_a_shared_grid_never_later_than_they_were_to() -> None:
    # Two shards whose next looks fall in one 200 ms cell of the grid both wake at its start.
    first = 1000.02 + on_grid(0.33, 0.2, 1000.02)  # would wake at 1000.35
    second = 1000.11 + on_grid(0.28, 0.2, 1000.11)  # would wake at 1000.39
    assert first == pytest.approx(1000.2) and second == pytest.approx(1000.2)
    # A grid point already passed: the wake is left where it was; no grid (no gather): unchanged.
    assert on_grid(0.05, 0.2, 1000.01) == pytest.approx(0.05)
    assert on_grid(0.33, 0.0, 1000.02) == pytest.approx(0.33)


def test_a_member_announced_while_the_pass_runs_cuts_the_following_sleep_short() -> None:
    alarm = Alarm()
    alarm.awake()
    alarm.added(5_000)  # announced after the claim read the window, before the pass planned its sleep
    alarm.plan(10_000)
    assert alarm.ring.is_set()


def test_an_idle_leader_wakes_for_its_published_marks_before_the_sweeper_would_publish_them_again() -> None:
    now = [100.0]
    config = DispatcherConfig(mark_published_after_sec=1.0, mark_published_every_sec=0.5)
    marks = PublishedMarks(cast(DispatchStore, None), 1.0, 0.5, clock=lambda: now[0])
    leader = ShardDispatcher(0, 1, "a", None, None, None, config, clock=FakeClock(NOW), marks=marks)  # type: ignore[arg-type]
    assert leader.next_look() is None, "nothing in the window, no marks: the horizon bounds the sleep"
    marks.add([uuid4()])
    now[0] = 100.4
    assert leader.next_look() == NOW + timedelta(seconds=1.1), "the marks are written 1.5 s after the publish"
    assert idle_wait(NOW, leader.next_look(), float("inf"), 0.05, True) == pytest.approx(1.101)
    leader._window_next = NOW + timedelta(milliseconds=300)
    assert leader.next_look() == NOW + timedelta(milliseconds=300), "a member due sooner comes first"
    now[0] = 103.0
    assert leader.next_look() == NOW, "overdue marks: a pass at once"


def test_due_work_waiting_for_room_in_the_fair_buffer_is_looked_at_every_poll_interval() -> None:
    config = DispatcherConfig(poll_interval_sec=0.05, fairness=FairnessConfig(buffer_cap=10, claim_size=10))
    fair = FairDispatch(0, None, None, None, None, config.fairness, 100)  # type: ignore[arg-type]
    leader = ShardDispatcher(0, 1, "a", None, None, None, config, clock=FakeClock(NOW), fair=fair)  # type: ignore[arg-type]
    fair._window_next = NOW + timedelta(milliseconds=300)
    assert leader.next_look() == NOW + timedelta(milliseconds=300), "nothing waits: the window's next member"
    fair.queue.add([Waiting(Occurrence(uuid4(), NOW), "a", "p")])
    assert leader.next_look() == NOW + timedelta(milliseconds=50), "room comes with the next read, not at once"
    fair.queue = FairQueue()
    fair.early.push(Waiting(Occurrence(uuid4(), NOW + timedelta(seconds=1)), "a", "p") for _ in range(10))
    assert leader.next_look() == NOW + timedelta(milliseconds=50), "a full buffer: looked at every poll interval"
