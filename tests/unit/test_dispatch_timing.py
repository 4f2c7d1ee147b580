"""When a shard leader looks at its window next (sundial_dispatcher.shards._idle_wait) and what wakes it early."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from sundial_common.hotwindow import WAKE_HORIZON_SEC
from sundial_dispatcher.shards import _idle_wait
from sundial_dispatcher.wakes import Alarm

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_leader_sleeps_until_the_next_due_member_and_no_longer_than_the_horizon() -> None:
    assert _idle_wait(NOW, NOW + timedelta(milliseconds=200), 10.0, 0.05, True) == pytest.approx(0.201)
    assert _idle_wait(NOW, NOW + timedelta(hours=1), 10.0, 0.05, True) == WAKE_HORIZON_SEC
    assert _idle_wait(NOW, None, 10.0, 0.05, True) == WAKE_HORIZON_SEC


def test_without_wake_ups_a_leader_looks_every_poll_interval() -> None:
    assert _idle_wait(NOW, None, 10.0, 0.05, False) == 0.05
    assert _idle_wait(NOW, NOW + timedelta(seconds=5), 10.0, 0.05, False) == 0.05


def test_due_work_still_waiting_is_looked_at_every_poll_interval_and_side_work_bounds_the_sleep() -> None:
    assert _idle_wait(NOW, NOW, 10.0, 0.05, True) == 0.05
    assert _idle_wait(NOW, NOW - timedelta(seconds=1), 10.0, 0.05, True) == 0.05
    assert _idle_wait(NOW, None, 0.3, 0.05, True) == 0.3
    assert _idle_wait(NOW, None, -1.0, 0.05, True) == 0.0


async def test_an_alarm_rings_for_members_due_before_the_planned_look_only() -> None:
    alarm = Alarm()
    alarm.awake()
    alarm.plan(1_000)
    alarm.added(2_000)
    assert not alarm.ring.is_set()
    alarm.added(500)
    assert alarm.ring.is_set()
    await asyncio.wait_for(alarm.ring.wait(), 1)


def test_a_member_announced_while_the_pass_runs_cuts_the_following_sleep_short() -> None:
    alarm = Alarm()
    alarm.awake()
    alarm.added(5_000)  # announced after the claim read the window, before the pass planned its sleep
    alarm.plan(10_000)
    assert alarm.ring.is_set()
