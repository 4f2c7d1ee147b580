"""The hydrator on real Postgres and Redis: it promotes what falls due within the hot window, rebuilds a flushed
window (every shard's next jobs first), pages through a crowded instant and re-adds what an overdue scan finds
missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from sundial_common.hotwindow.window import HotWindow
from sundial_common.stores import Stores
from sundial_common.stores.types import Occurrence, RetryDue
from sundial_common.testing import FakeClock
from sundial_hydrator.hydrator import Hydrator, HydratorConfig

from tests.support.dispatch import hot_window, make_job, pool
from tests.support.hot_window import window_members

__all__ = ["hot_window", "pool"]  # the fixtures


async def test_hydrator_promotes_only_the_hot_window_and_rebuilds_after_a_flush(
    stores: Stores, hot_window: HotWindow, pool: str
) -> None:
    now = datetime.now(UTC)
    soon = [await make_job(stores, now + timedelta(minutes=m), pool) for m in (1, 2, 30)]
    later = await make_job(stores, now + timedelta(hours=3), pool)
    hydrator = Hydrator(stores, hot_window, HydratorConfig(hot_window_sec=3600, batch_size=2))

    result = await hydrator.run_once()

    assert result.promoted == 3
    members = await window_members(hot_window.redis, hot_window.key(0))
    assert members == {f"j:{j}" for j in soon}
    assert f"j:{later}" not in members
    assert (await hydrator.run_once()).promoted == 0  # idempotent: the watermark moved

    await hot_window.redis.flushall()
    rebuilt = await hydrator.run_once()
    assert rebuilt.rebuilt_shards == 1
    assert await hot_window.size(0) == 3


async def test_an_idle_hydrator_scans_postgres_once_per_promotion_slice_and_still_rebuilds_a_flush_at_once(
    stores: Stores, hot_window: HotWindow, pool: str
) -> None:
    clock = FakeClock(datetime.now(UTC))
    config = HydratorConfig(shards=2, hot_window_sec=3600, promote_slice_sec=10)
    hydrator = Hydrator(stores, hot_window, config, clock=clock)
    assert (await hydrator.run_once()).scanned_shards == 2  # first pass: no watermark yet

    clock.advance(1)
    assert (await hydrator.run_once()).scanned_shards == 0  # the edge moved 1 s: within the slice

    # A job at the window's edge, registered straight in Postgres (as nothing near-due would be): promoted
    # once the edge is a slice past the watermark, still an hour before it is due.
    edge = await make_job(stores, clock.now() + timedelta(seconds=3600 + 5), pool)
    clock.advance(10)
    promoted = await hydrator.run_once()
    assert (promoted.scanned_shards, promoted.promoted) == (2, 1)
    assert await hot_window.redis.zscore(hot_window.key(0), f"j:{edge}") is not None

    clock.advance(1)
    await hot_window.redis.flushall()
    rebuilt = await hydrator.run_once()  # the very next pass, slice or not
    assert (rebuilt.rebuilt_shards, await hot_window.size(0)) == (2, 1)


async def test_a_rebuild_restores_every_shards_next_jobs_before_any_shards_later_ones(
    stores: Stores, hot_window: HotWindow, pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a flush at scale, the last shard's near-due jobs must not wait for the other shards' whole hour."""
    now = datetime.now(UTC)
    for shard in range(3):
        for minute in range(1, 7):
            await make_job(stores, now + timedelta(minutes=minute), pool, shard=shard)
    landed: list[tuple[int, datetime]] = []  # (shard, latest due) of each page, in the order Redis got them
    hydrate = hot_window.hydrate

    async def spy(
        shard: int,
        expected: int | None,
        new: int | None,
        occurrences: Sequence[Occurrence],
        retries: Sequence[RetryDue] = (),
    ) -> bool:
        if occurrences:
            landed.append((shard, max(o.due for o in occurrences)))
        return await hydrate(shard, expected, new, occurrences, retries)

    monkeypatch.setattr(hot_window, "hydrate", spy)
    result = await Hydrator(stores, hot_window, HydratorConfig(shards=3, batch_size=2)).run_once()

    assert (result.rebuilt_shards, result.promoted) == (3, 18)
    first_pages = [landed.index(next(page for page in landed if page[0] == shard)) for shard in range(3)]
    assert max(first_pages) < 3  # each shard's first two minutes were in before any shard's later pages
    assert all(due <= now + timedelta(minutes=2, seconds=1) for _, due in landed[:3])


async def test_hydrator_pages_through_many_jobs_due_at_one_instant(
    stores: Stores, hot_window: HotWindow, pool: str
) -> None:
    due = datetime.now(UTC) + timedelta(minutes=5)
    jobs = [await make_job(stores, due, pool) for _ in range(7)]
    await Hydrator(stores, hot_window, HydratorConfig(batch_size=3)).run_once()
    assert await hot_window.size(0) == len(jobs)


async def test_hydrator_re_adds_overdue_jobs_whose_member_was_lost(
    stores: Stores, hot_window: HotWindow, pool: str
) -> None:
    job_id = await make_job(stores, datetime.now(UTC) - timedelta(seconds=60), pool)
    await Hydrator(stores, hot_window, HydratorConfig(overdue_grace_sec=15)).run_once()
    assert await hot_window.redis.zscore(hot_window.key(0), f"j:{job_id}") is not None


async def test_the_overdue_scan_re_adds_each_shards_lost_jobs_and_triggers_to_that_shard(
    stores: Stores, hot_window: HotWindow, pool: str
) -> None:
    hydrator = Hydrator(stores, hot_window, HydratorConfig(shards=3, overdue_grace_sec=15, batch_size=2))
    await hydrator.run_once()  # the rebuild: from now on only the overdue scan brings a lost member back
    late = datetime.now(UTC) - timedelta(seconds=60)
    lost = {shard: [await make_job(stores, late, pool, shard=shard) for _ in range(3)] for shard in (0, 2)}
    triggered = await make_job(stores, datetime.now(UTC) + timedelta(days=1), pool, shard=1)
    await stores.database.pool.execute("UPDATE jobs SET trigger_at = $2 WHERE id = $1", triggered, late)

    hydrator._last_overdue_scan = float("-inf")  # the next overdue scan is due now
    result = await hydrator.run_once()

    members = {shard: await window_members(hot_window.redis, hot_window.key(shard)) for shard in range(3)}
    # Up to batch_size of each kind per shard: one shard's backlog does not crowd another's out.
    assert len(members[0]) == len(members[2]) == 2 and result.recovered == 5
    assert members[0] <= {f"j:{job}" for job in lost[0]} and members[2] <= {f"j:{job}" for job in lost[2]}
    assert members[1] == {f"j:{triggered}"}
