"""Recurring jobs through the real dispatch transaction: next fires, DST, jitter, overlap and catch-up policies,
max runs and end, manual triggers, misplaced members — on real Postgres, Redis and the broker.

The dispatcher runs one pass at a time (``run_once``) under a clock the test moves, so a day of fires takes
milliseconds and nothing sleeps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import uuid
import zoneinfo
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from sundial_common.broker.kafka import KafkaPublisher
from sundial_common.broker.messages import pool_topic
from sundial_common.domain.ids import new_id
from sundial_common.domain.schedules import Kind, ScheduleSpec, fire_at, next_fire
from sundial_common.hotwindow.window import HotWindow
from sundial_common.runtime.clock import to_ms
from sundial_common.stores import Stores
from sundial_common.stores.dispatch import (
    DispatchStore,
    FencedOut,
    LockedShard,
    OccurrenceTransaction,
    ShardClaims,
)
from sundial_common.stores.types import Occurrence, Record
from sundial_common.testing import FakeClock
from sundial_dispatcher.dispatcher import CANCEL_KEY, DispatcherConfig, DispatchResult, ShardDispatcher
from sundial_dispatcher.tenancy import TenantPolicy
from sundial_hydrator.hydrator import Hydrator, HydratorConfig

from tests.support.dispatch import consume, hot_window, pool

__all__ = ["hot_window", "pool"]  # the fixtures

MINUTE = timedelta(minutes=1)


#: A minute boundary near the real time (the clock is the test's, the broker's timestamps are real).
T0 = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(minutes=2)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def dispatcher(stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, clock: FakeClock) -> ShardDispatcher:
    return ShardDispatcher(0, 1, "replica-a", stores.dispatch, hot_window, publisher, DispatcherConfig(), clock=clock)


async def make_job(
    stores: Stores,
    hot_window: HotWindow,
    pool: str,
    *,
    schedule: str | None = "* * * * *",
    zone: str = "UTC",
    first: datetime = T0,
    jitter_sec: int = 0,
    **columns: Any,
) -> uuid.UUID:
    """A CRON job at its first occurrence ``first`` (nominal), in the hot window, as the API stores one."""
    job_id = new_id()
    due = fire_at(job_id, first, jitter_sec)
    await stores.jobs.insert_job(
        {
            "id": job_id,
            "tenant_id": "acme",
            "name": "recurring",
            "type": "CRON",
            "schedule": schedule,
            "timezone": zone,
            "pool": pool,
            "handler": "echo",
            "payload": {},
            "timeout_sec": 30,
            "shard": 0,
            "jitter_sec": jitter_sec,
            "next_nominal_at": first,
            "next_fire_at": due,
            **columns,
        },
        actor="test",
    )
    await hot_window.add(0, [Occurrence(job_id, due)])
    return job_id


async def at(clock: FakeClock, dispatcher: ShardDispatcher, instant: datetime) -> DispatchResult:
    clock.set(instant)
    return await dispatcher.run_once()


async def executions(stores: Stores, job_id: uuid.UUID) -> list[Any]:
    return list(
        await stores.database.pool.fetch("SELECT * FROM executions WHERE job_id = $1 ORDER BY scheduled_for", job_id)
    )


async def job(stores: Stores, job_id: uuid.UUID) -> Any:
    return await stores.database.pool.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)


async def score(hot_window: HotWindow, job_id: uuid.UUID) -> float | None:
    return await hot_window.redis.zscore(hot_window.key(0), f"j:{job_id}")


# --- the schedule ----------------------------------------------------------------------------------------


async def test_each_fire_recomputes_the_next_from_the_schedule_and_requeues_it(
    stores: Stores,
    hot_window: HotWindow,
    dispatcher: ShardDispatcher,
    clock: FakeClock,
    pool: str,
    kafka_bootstrap: str,
) -> None:
    job_id = await make_job(stores, hot_window, pool)

    assert (await at(clock, dispatcher, T0)).dispatched == 1
    row = await job(stores, job_id)
    assert (row["state"], row["next_fire_at"], row["next_nominal_at"], row["fire_count"]) == (
        "ACTIVE",
        T0 + MINUTE,
        T0 + MINUTE,
        1,
    )
    assert await score(hot_window, job_id) == to_ms(T0 + MINUTE)  # back in the hot window at once
    assert (await at(clock, dispatcher, T0 + MINUTE - timedelta(milliseconds=1))).claimed == 0
    assert (await at(clock, dispatcher, T0 + MINUTE)).dispatched == 1

    rows = await executions(stores, job_id)
    assert [(r["scheduled_for"], r["fire_at"], r["state"]) for r in rows] == [
        (T0, T0, "PENDING"),
        (T0 + MINUTE, T0 + MINUTE, "PENDING"),
    ]
    messages = consume(kafka_bootstrap, pool_topic(pool), 2)
    assert sorted(m.scheduled_for for m in messages) == [T0.isoformat(), (T0 + MINUTE).isoformat()]


async def test_a_jittered_fire_keeps_its_nominal_time_beside_the_actual_one(
    stores: Stores, hot_window: HotWindow, dispatcher: ShardDispatcher, clock: FakeClock, pool: str
) -> None:
    job_id = await make_job(stores, hot_window, pool, jitter_sec=30)
    due = fire_at(job_id, T0, 30)

    assert (await at(clock, dispatcher, T0)).claimed == (1 if due == T0 else 0)
    assert (await at(clock, dispatcher, due)).dispatched == 1

    [execution] = await executions(stores, job_id)
    assert (execution["scheduled_for"], execution["fire_at"]) == (T0, due)
    row = await job(stores, job_id)
    assert row["next_nominal_at"] == T0 + MINUTE
    assert row["next_fire_at"] == fire_at(job_id, T0 + MINUTE, 30)  # the same delay a restart would compute


@pytest.mark.parametrize(
    ("schedule", "fires_that_day"),
    [("0 * * * *", 25), ("*/30 * * * *", 50), ("30 1 * * *", 1), ("0 2 * * *", 1)],
)
async def test_the_dispatcher_follows_the_dst_rule_through_a_fall_back_day(
    stores: Stores,
    hot_window: HotWindow,
    dispatcher: ShardDispatcher,
    clock: FakeClock,
    pool: str,
    schedule: str,
    fires_that_day: int,
) -> None:
    zone = zoneinfo.ZoneInfo("America/New_York")
    day_start = datetime(2030, 11, 3, tzinfo=zone).astimezone(UTC)
    day_end = datetime(2030, 11, 4, tzinfo=zone).astimezone(UTC)
    first = first_of(schedule, "America/New_York", day_start)
    job_id = await make_job(stores, hot_window, pool, schedule=schedule, zone="America/New_York", first=first)

    while (row := await job(stores, job_id))["next_fire_at"] < day_end:
        await hot_window.add(0, [Occurrence(job_id, row["next_fire_at"])])  # the hydrator would, when due
        assert (await at(clock, dispatcher, row["next_fire_at"])).dispatched == 1

    fired = [r["scheduled_for"] for r in await executions(stores, job_id)]
    assert len(fired) == fires_that_day
    assert len(set(fired)) == len(fired)
    if fires_that_day > 1:  # real time: evenly spaced, no gap, no repeat
        assert len({b - a for a, b in itertools.pairwise(fired)}) == 1


def first_of(schedule: str, zone: str, start: datetime) -> datetime:
    first = next_fire(ScheduleSpec(Kind.CRON, timezone=zone, cron=schedule), start - timedelta(milliseconds=1))
    assert first is not None
    return first


# --- overlap -------------------------------------------------------------------------------------------


async def test_overlap_skip_records_a_skipped_execution_and_never_publishes_it(
    stores: Stores, hot_window: HotWindow, dispatcher: ShardDispatcher, clock: FakeClock, pool: str
) -> None:
    job_id = await make_job(stores, hot_window, pool, overlap_policy="SKIP")
    await at(clock, dispatcher, T0)  # PENDING: no worker picks it up

    result = await at(clock, dispatcher, T0 + MINUTE)

    assert (result.dispatched, result.skipped) == (0, 1)
    first, skipped = await executions(stores, job_id)
    assert (skipped["scheduled_for"], skipped["state"], skipped["published_at"]) == (T0 + MINUTE, "SKIPPED", None)
    assert skipped["finished_at"] is not None and "overlapPolicy SKIP" in skipped["error"]
    row = await job(stores, job_id)
    assert (row["next_fire_at"], row["fire_count"]) == (T0 + 2 * MINUTE, 1)  # skips are not runs
    assert (
        await stores.database.pool.fetchval(
            "SELECT count(*) FROM audit_log WHERE entity_id = $1 AND action = 'skip'", skipped["id"]
        )
        == 1
    )

    await stores.database.pool.execute("UPDATE executions SET state = 'SUCCEEDED' WHERE id = $1", first["id"])
    assert (await at(clock, dispatcher, T0 + 2 * MINUTE)).dispatched == 1


async def test_buffer_one_waits_for_the_open_execution_then_runs_and_drops_what_came_meanwhile(
    stores: Stores, hot_window: HotWindow, dispatcher: ShardDispatcher, clock: FakeClock, pool: str
) -> None:
    job_id = await make_job(stores, hot_window, pool, overlap_policy="BUFFER_ONE", catchup_window_sec=3600)
    await at(clock, dispatcher, T0)
    [running] = await executions(stores, job_id)
    await stores.database.pool.execute("UPDATE executions SET state = 'RUNNING' WHERE id = $1", running["id"])

    held = await at(clock, dispatcher, T0 + MINUTE)

    assert (held.held, held.dispatched) == (1, 0)
    assert len(await executions(stores, job_id)) == 1
    assert (await job(stores, job_id))["next_fire_at"] == T0 + MINUTE  # not advanced: it waits
    assert await score(hot_window, job_id) == to_ms(T0 + MINUTE + timedelta(seconds=1))  # looked at again soon
    assert (await at(clock, dispatcher, T0 + MINUTE + timedelta(seconds=1))).held == 1  # still running

    await stores.database.pool.execute("UPDATE executions SET state = 'SUCCEEDED' WHERE id = $1", running["id"])
    released = await at(clock, dispatcher, T0 + 2 * MINUTE + timedelta(seconds=5))

    assert (released.dispatched, released.skipped) == (1, 1)
    rows = await executions(stores, job_id)
    assert [(r["scheduled_for"], r["state"]) for r in rows[1:]] == [
        (T0 + MINUTE, "PENDING"),  # the buffered one, late
        (T0 + 2 * MINUTE, "SKIPPED"),  # came due while the buffer was full
    ]
    assert (await job(stores, job_id))["next_fire_at"] == T0 + 3 * MINUTE


async def test_cancel_running_asks_the_open_execution_to_stop_and_runs_the_new_one(
    stores: Stores, hot_window: HotWindow, dispatcher: ShardDispatcher, clock: FakeClock, pool: str
) -> None:
    job_id = await make_job(stores, hot_window, pool, overlap_policy="CANCEL_RUNNING")
    await at(clock, dispatcher, T0)
    [running] = await executions(stores, job_id)
    await stores.database.pool.execute("UPDATE executions SET state = 'RUNNING' WHERE id = $1", running["id"])

    assert (await at(clock, dispatcher, T0 + MINUTE)).dispatched == 1

    old, new = await executions(stores, job_id)
    assert (old["state"], new["state"]) == ("RUNNING", "PENDING")  # the worker ends the old one
    assert old["cancel_requested_at"] is not None
    assert await hot_window.redis.get(CANCEL_KEY.format(execution_id=old["id"])) == b"1"

    # A PENDING one (never picked up) is cancelled outright.
    assert (await at(clock, dispatcher, T0 + 2 * MINUTE)).dispatched == 1
    states = [(r["state"], r["cancel_requested_at"] is not None) for r in await executions(stores, job_id)]
    assert states == [("RUNNING", True), ("CANCELLED", True), ("PENDING", False)]


# --- catch-up ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "cap", "runs", "missed"),
    [
        ("FIRE_ONCE", 100, [10], 10),  # one run, for the most recent
        ("FIRE_ALL", 100, list(range(11)), 0),
        ("FIRE_ALL", 4, [0, 1, 2, 3], 7),  # capped: the rest are missed
        ("SKIP", 100, [], 11),
    ],
)
async def test_catch_up_after_downtime_follows_the_policy_and_counts_missed_fires(
    stores: Stores,
    hot_window: HotWindow,
    publisher: KafkaPublisher,
    clock: FakeClock,
    pool: str,
    policy: str,
    cap: int,
    runs: list[int],
    missed: int,
) -> None:
    dispatcher = ShardDispatcher(
        0, 1, "replica-a", stores.dispatch, hot_window, publisher, DispatcherConfig(fire_all_cap=cap), clock=clock
    )
    job_id = await make_job(stores, hot_window, pool, catchup_policy=policy, catchup_window_sec=30)

    # Down from T0 until 40 s after T0+10min: 11 occurrences came due, every one more than 30 s ago.
    result = await at(clock, dispatcher, T0 + 10 * MINUTE + timedelta(seconds=40))

    assert (result.dispatched, result.missed) == (len(runs), missed)
    assert [r["scheduled_for"] for r in await executions(stores, job_id)] == [T0 + m * MINUTE for m in runs]
    row = await job(stores, job_id)
    assert (row["missed_fires"], row["fire_count"], row["next_fire_at"]) == (missed, len(runs), T0 + 11 * MINUTE)
    audit = await stores.database.pool.fetchval(
        "SELECT detail FROM audit_log WHERE entity_id = $1 AND action = 'missed'", job_id
    )
    assert audit == ({"missedFires": missed} if missed else None)


async def test_occurrences_late_within_the_window_each_run(
    stores: Stores, hot_window: HotWindow, dispatcher: ShardDispatcher, clock: FakeClock, pool: str
) -> None:
    job_id = await make_job(stores, hot_window, pool, catchup_policy="SKIP", catchup_window_sec=300)
    result = await at(clock, dispatcher, T0 + 3 * MINUTE)  # a dispatcher restart: 4 due, none missed
    assert (result.dispatched, result.missed) == (4, 0)
    assert len(await executions(stores, job_id)) == 4


# --- the end of a schedule -------------------------------------------------------------------------------


async def test_max_runs_and_end_at_complete_the_job(
    stores: Stores, hot_window: HotWindow, dispatcher: ShardDispatcher, clock: FakeClock, pool: str
) -> None:
    limited = await make_job(stores, hot_window, pool, max_runs=2)
    ending = await make_job(stores, hot_window, pool, end_at=T0 + MINUTE)

    await at(clock, dispatcher, T0)
    assert {(await job(stores, j))["state"] for j in (limited, ending)} == {"ACTIVE"}
    await at(clock, dispatcher, T0 + MINUTE)

    for job_id in (limited, ending):
        row = await job(stores, job_id)
        assert (row["state"], row["next_fire_at"], row["fire_count"]) == ("COMPLETED", None, 2)
        assert await score(hot_window, job_id) is None
        assert (
            await stores.database.pool.fetchval(
                "SELECT count(*) FROM audit_log WHERE entity_id = $1 AND action = 'complete'", job_id
            )
            == 1
        )


# --- manual triggers and misplaced members ---------------------------------------------------------------


@pytest.mark.parametrize("state", ["ACTIVE", "PAUSED"])
async def test_a_trigger_runs_once_without_moving_the_schedule(
    stores: Stores, hot_window: HotWindow, dispatcher: ShardDispatcher, clock: FakeClock, pool: str, state: str
) -> None:
    job_id = await make_job(stores, hot_window, pool, first=T0 + timedelta(days=1), schedule="0 0 * * *")
    execution_id = new_id()
    await stores.database.pool.execute(
        "UPDATE jobs SET state = $2, trigger_at = $3, trigger_execution_id = $4 WHERE id = $1",
        job_id,
        state,
        T0,
        execution_id,
    )
    await hot_window.add(0, [Occurrence(job_id, T0)])  # what the API does

    assert (await at(clock, dispatcher, T0)).dispatched == 1

    [execution] = await executions(stores, job_id)
    assert (execution["id"], execution["scheduled_for"], execution["triggered"]) == (execution_id, T0, True)
    row = await job(stores, job_id)
    assert (row["state"], row["next_fire_at"], row["fire_count"], row["trigger_at"]) == (
        state,
        T0 + timedelta(days=1),
        0,
        None,
    )
    assert await score(hot_window, job_id) is None  # its next fire is beyond the hot window: the hydrator's


async def test_a_member_that_raced_ahead_of_a_reschedule_is_put_back_where_it_belongs(
    stores: Stores, hot_window: HotWindow, dispatcher: ShardDispatcher, clock: FakeClock, pool: str
) -> None:
    moved = await make_job(stores, hot_window, pool)
    cancelled = await make_job(stores, hot_window, pool)
    await stores.database.pool.execute(
        "UPDATE jobs SET next_fire_at = $2, next_nominal_at = $2 WHERE id = $1", moved, T0 + 2 * MINUTE
    )
    await stores.database.pool.execute("UPDATE jobs SET state = 'CANCELLED' WHERE id = $1", cancelled)

    result = await at(clock, dispatcher, T0)

    assert (result.claimed, result.dispatched) == (2, 0)
    assert await score(hot_window, moved) == to_ms(T0 + 2 * MINUTE)
    assert await score(hot_window, cancelled) is None


async def test_the_hydrator_recovers_a_trigger_whose_member_was_lost(
    stores: Stores, hot_window: HotWindow, pool: str
) -> None:
    job_id = await make_job(stores, hot_window, pool, first=T0 + timedelta(days=1))
    await hot_window.redis.flushall()
    lost_at = datetime.now(UTC).replace(microsecond=0) - MINUTE
    await stores.database.pool.execute(
        "UPDATE jobs SET trigger_at = $2, trigger_execution_id = $3 WHERE id = $1", job_id, lost_at, new_id()
    )
    await Hydrator(stores, hot_window, HydratorConfig(overdue_grace_sec=15)).run_once()
    assert await score(hot_window, job_id) == to_ms(lost_at)


# --- tenants ---------------------------------------------------------------------------------------------


async def test_a_suspended_tenants_jobs_wait_and_resume_with_the_catch_up_policy(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, clock: FakeClock, pool: str
) -> None:
    tenants = TenantPolicy(stores.tenants, refresh_sec=0)
    dispatcher = ShardDispatcher(
        0, 1, "replica-a", stores.dispatch, hot_window, publisher, DispatcherConfig(), clock=clock, tenants=tenants
    )
    job_id = await make_job(stores, hot_window, pool, catchup_window_sec=60)
    acme = await stores.tenants.get_tenant("acme")
    assert acme is not None
    await stores.tenants.update_tenant(dataclasses.replace(acme, state="SUSPENDED"))

    held = await at(clock, dispatcher, T0)
    assert held.dispatched == 0 and held.held == 1
    assert await executions(stores, job_id) == []
    assert (await job(stores, job_id))["next_fire_at"] == T0  # the schedule did not move

    # Resumed ten minutes later, the fires that came due meet the catch-up policy (FIRE_ONCE, 60 s window):
    # the last two are within the window and run, the nine before them are missed.
    suspended = await stores.tenants.get_tenant("acme")
    assert suspended is not None
    await stores.tenants.update_tenant(dataclasses.replace(suspended, state="ACTIVE"))
    resumed = await at(clock, dispatcher, T0 + 10 * MINUTE)
    assert resumed.dispatched == 2
    assert (await job(stores, job_id))["missed_fires"] == 9


# --- what the dispatch reads of a locked job -------------------------------------------------------------


class _Reading(Mapping[str, Any]):
    """A locked job's row that notes each column read of it: a Record's ``get`` of a column it was not given is
    None, not an error, so a column missing from ``lock_due_jobs`` would silently read as NULL."""

    def __init__(self, row: Mapping[str, Any], read: set[str]) -> None:
        self._row, self._read = row, read

    def __getitem__(self, column: str) -> Any:
        self._read.add(column)
        return self._row[column]

    def __iter__(self) -> Iterator[str]:
        return iter(self._row.keys())

    def __len__(self) -> int:
        return len(self._row)


class _ReadingStore:
    """The dispatch store, handing the dispatcher its locked rows as :class:`_Reading` (the plan and the messages are
    built from them): ``read`` is every column the dispatch read, ``given`` every column it was given."""

    def __init__(self, store: DispatchStore) -> None:
        self._store = store
        self.read: set[str] = set()
        self.given: set[str] = set()

    @contextlib.asynccontextmanager
    async def occurrence_transaction(self, holder: str) -> AsyncIterator[Any]:
        async with self._store.occurrence_transaction(holder) as tx:
            yield _ReadingTransaction(tx, self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class _ReadingTransaction:
    """An open dispatch transaction whose locked rows come back as :class:`_Reading`."""

    def __init__(self, tx: OccurrenceTransaction, store: _ReadingStore) -> None:
        self._tx = tx
        self._store = store

    async def lock(self, parts: Sequence[ShardClaims]) -> list[LockedShard | FencedOut]:
        locked: list[LockedShard | FencedOut] = []
        for lock in await self._tx.lock(parts):
            if isinstance(lock, LockedShard):
                for row in lock.due:
                    self._store.given |= set(row.keys())
                rows: list[Record] = [_Reading(row, self._store.read) for row in lock.due]
                lock = dataclasses.replace(lock, due=rows)
            locked.append(lock)
        return locked

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)


async def test_the_dispatch_reads_only_columns_the_lock_returns(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, clock: FakeClock, pool: str
) -> None:
    store = _ReadingStore(stores.dispatch)
    dispatcher = ShardDispatcher(
        0, 1, "replica-a", cast(DispatchStore, store), hot_window, publisher, DispatcherConfig(), clock=clock
    )
    # Every kind of schedule, jitter and bounds, an overlap policy with an open execution, a trigger, a one-shot.
    await make_job(stores, hot_window, pool, jitter_sec=5, max_runs=3, end_at=T0 + timedelta(days=1))
    await make_job(stores, hot_window, pool, overlap_policy="SKIP", catchup_policy="FIRE_ALL")
    await make_job(stores, hot_window, pool, type="INTERVAL", schedule=None, interval_sec=60, start_at=T0)
    await make_job(stores, hot_window, pool, type="RUN_LIST", schedule=None, run_list=[T0, T0 + MINUTE])
    await make_job(stores, hot_window, pool, type="ONE_SHOT", schedule=None, run_at=T0, traceparent=_PARENT)
    triggered = await make_job(stores, hot_window, pool, first=T0 + timedelta(days=1), schedule="0 0 * * *")
    await stores.database.pool.execute(
        "UPDATE jobs SET trigger_at = $2, trigger_execution_id = $3, trigger_traceparent = $4 WHERE id = $1",
        triggered,
        T0,
        new_id(),
        _PARENT,
    )
    await hot_window.add(0, [Occurrence(triggered, T0)])

    assert (await at(clock, dispatcher, T0 + timedelta(seconds=5))).dispatched == 6
    result = await at(clock, dispatcher, T0 + MINUTE + timedelta(seconds=5))
    assert (result.dispatched, result.skipped) == (3, 1)

    assert store.read, "the planner read the rows it was given"
    assert store.read <= store.given, f"read but not locked: {sorted(store.read - store.given)}"
    assert "breaker" in store.given  # read by the breakers' HOLD before planning (sundial_common.stores.breakers)


_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
