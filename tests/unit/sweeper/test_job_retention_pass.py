"""The job retention pass over an in-memory job store: which jobs go, in how many batches, and when it stops."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sundial_common.domain.ids import new_id
from sundial_common.testing import FakeClock, InMemoryJobStore
from sundial_sweeper.job_retention import JobRetention, JobRetentionConfig, JobRetentionPass

START = datetime(2026, 11, 1, tzinfo=UTC)


class Partitions:
    """The oldest day of executions left (None: no executions table to go by)."""

    def __init__(self, begin: datetime | None) -> None:
        self.begin = begin

    async def executions_begin(self) -> datetime | None:
        return self.begin


class Triggers:
    """Consumed triggers: none here, each prune call counted."""

    def __init__(self) -> None:
        self.calls = 0

    async def prune_consumed_triggers(self, before: datetime, limit: int) -> int:
        self.calls += 1
        return 0


async def ended_jobs(store: InMemoryJobStore, n: int, state: str = "CANCELLED") -> None:
    for _ in range(n):
        job = await store.insert_job(
            {
                "id": new_id(),
                "tenant_id": "acme",
                "name": "old",
                "type": "ONE_SHOT",
                "pool": "demo",
                "handler": "echo",
                "timeout_sec": 30,
                "shard": 0,
                "next_fire_at": START,
            },
            "test",
        )
        if state == "CANCELLED":
            await store.cancel_job("acme", job["id"], "test")


def retention(store: InMemoryJobStore, begin: datetime | None, **config: int) -> JobRetention:
    return JobRetention(store, Triggers(), Partitions(begin), JobRetentionConfig(**config))  # type: ignore[arg-type]


async def test_jobs_that_ended_a_margin_before_the_oldest_executions_go_in_batches_the_others_stay() -> None:
    clock = FakeClock(START)
    store = InMemoryJobStore(clock=clock)
    await ended_jobs(store, 25)
    await ended_jobs(store, 3, state="ACTIVE")
    clock.advance(timedelta(days=3))
    await ended_jobs(store, 4)  # ended after the horizon: their executions may still be there

    done = await retention(store, START + timedelta(days=2), batch_size=10).run_once()
    assert done == JobRetentionPass(jobs=25)
    assert await store.count_tenant_jobs("acme") == {"ACTIVE": 3, "CANCELLED": 4}


async def test_a_pass_stops_after_its_batches_and_the_next_one_goes_on() -> None:
    store = InMemoryJobStore(clock=FakeClock(START))
    await ended_jobs(store, 25)
    prune = retention(store, START + timedelta(days=5), batch_size=10, max_batches=2)
    assert await prune.run_once() == JobRetentionPass(jobs=20)
    assert await prune.run_once() == JobRetentionPass(jobs=5)
    assert await prune.run_once() == JobRetentionPass()


async def test_without_executions_to_go_by_nothing_is_pruned() -> None:
    store = InMemoryJobStore(clock=FakeClock(START))
    await ended_jobs(store, 3)
    assert await retention(store, None).run_once() == JobRetentionPass()
    assert await store.count_tenant_jobs("acme") == {"CANCELLED": 3}
