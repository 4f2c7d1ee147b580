"""Several shards' dispatch passes in one transaction on real Postgres: each shard under its own fence, a
fenced-out shard writing nothing while the others commit, passes that claim together gathered into one
transaction, and a failed shared transaction leaving every job to be dispatched once by the next passes.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from sundial_common.broker.kafka import KafkaPublisher
from sundial_common.broker.messages import pool_topic
from sundial_common.domain.ids import new_id
from sundial_common.hotwindow.window import HotWindow
from sundial_common.stores import Stores
from sundial_common.stores.dispatch import FencedOut, PlannedExecution
from sundial_common.stores.types import Occurrence
from sundial_dispatcher import group_commit
from sundial_dispatcher.dispatcher import DispatcherConfig, DispatchResult, ShardDispatcher
from sundial_dispatcher.group_commit import GroupCommit

from tests.support.dispatch import consume, hot_window, make_job, ms_precision, pool

__all__ = ["hot_window", "pool"]  # the fixtures


async def test_passes_of_several_shards_commit_in_one_transaction_each_under_its_own_fence(
    stores: Stores, hot_window: HotWindow, pool: str
) -> None:
    due = datetime.now(UTC) - timedelta(milliseconds=10)
    jobs = {shard: [await make_job(stores, due, pool, shard=shard) for _ in range(2)] for shard in (0, 1)}
    tokens = {shard: await stores.dispatch.take_shard(shard, "replica-a") for shard in (0, 1)}
    commits = GroupCommit(stores.dispatch)

    def plan(rows: Sequence[Any]) -> list[PlannedExecution]:
        return [PlannedExecution(new_id(), row, None, None) for row in rows]

    outcomes = await asyncio.gather(
        *(
            commits.dispatch_occurrences(
                shard, tokens[shard], "replica-a", [Occurrence(j, ms_precision(due)) for j in jobs[shard]], plan
            )
            for shard in (0, 1)
        )
    )

    assert (commits.transactions, commits.passes) == (1, 2), "the two passes came together: one transaction"
    assert [sorted(p.job["id"] for p in o.created) for o in outcomes] == [sorted(jobs[0]), sorted(jobs[1])]
    rows = await stores.database.pool.fetch("SELECT job_id, shard, fence_token FROM executions")
    assert {(r["job_id"], r["shard"], r["fence_token"]) for r in rows} == {
        (j, shard, tokens[shard]) for shard in (0, 1) for j in jobs[shard]
    }


async def test_a_fenced_out_shard_writes_nothing_in_a_shared_transaction_and_the_others_commit(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, pool: str, kafka_bootstrap: str
) -> None:
    due = datetime.now(UTC) - timedelta(milliseconds=10)
    led, lost = await make_job(stores, due, pool, shard=0), await make_job(stores, due, pool, shard=1)
    led_token = await stores.dispatch.take_shard(0, "replica-a")
    stale_token = await stores.dispatch.take_shard(1, "replica-a")
    newer_token = await stores.dispatch.take_shard(1, "replica-b")  # another replica has taken shard 1 since
    commits = GroupCommit(stores.dispatch)
    config = DispatcherConfig(shards=2)
    leader = ShardDispatcher(0, led_token, "replica-a", stores.dispatch, hot_window, publisher, config, commit=commits)
    stale = ShardDispatcher(1, stale_token, "replica-a", stores.dispatch, hot_window, publisher, config, commit=commits)
    await hot_window.add(0, [Occurrence(led, ms_precision(due))])
    await hot_window.add(1, [Occurrence(lost, ms_precision(due))])

    led_pass, stale_pass = await asyncio.gather(leader.run_once(), stale.run_once(), return_exceptions=True)

    assert isinstance(led_pass, DispatchResult) and led_pass.dispatched == 1
    assert isinstance(stale_pass, FencedOut)
    rows = await stores.database.pool.fetch("SELECT job_id, fence_token FROM executions")
    assert [(r["job_id"], r["fence_token"]) for r in rows] == [(led, led_token)]
    assert await stores.database.pool.fetchval("SELECT state FROM jobs WHERE id = $1", lost) == "ACTIVE"
    assert await stores.database.pool.fetchval("SELECT token FROM shard_fence WHERE shard = 1") == newer_token
    assert await hot_window.size(1) == 1, "the fenced-out pass gave its claim back for the shard's leader"
    # The shard's leader dispatches it: each job once, each published once.
    newer = ShardDispatcher(1, newer_token, "replica-b", stores.dispatch, hot_window, publisher, config)
    assert (await newer.run_once()).dispatched == 1
    executions = await _executions_by_job(stores)
    assert {job: token for job, (_, token) in executions.items()} == {led: led_token, lost: newer_token}
    assert await _published(kafka_bootstrap, pool, 2) == Counter(str(e) for e, _ in executions.values())


async def _executions_by_job(stores: Stores) -> dict[uuid.UUID, tuple[uuid.UUID, int]]:
    """Every execution's job → (execution id, fence token); a job with two executions fails."""
    rows = await stores.database.pool.fetch("SELECT id, job_id, fence_token FROM executions")
    assert len({r["job_id"] for r in rows}) == len(rows), "a job was dispatched twice"
    return {r["job_id"]: (r["id"], r["fence_token"]) for r in rows}


async def _published(bootstrap: str, pool: str, count: int) -> Counter[str]:
    """How many times each execution was published to ``pool``'s topic: ``count`` messages are expected, and one
    more is waited for a few seconds (a duplicate would be it)."""
    messages = await asyncio.to_thread(consume, bootstrap, pool_topic(pool), count + 1, 5.0)
    return Counter(m.execution_id for m in messages)


async def _leaders(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, pool: str, shards: Sequence[int], jobs: int
) -> tuple[list[ShardDispatcher], GroupCommit, list[uuid.UUID]]:
    """A process's leaders of ``shards`` committing through one GroupCommit, ``jobs`` due jobs in each shard's
    hot window; the jobs."""
    due = datetime.now(UTC) - timedelta(milliseconds=10)
    made: list[uuid.UUID] = []
    for shard in shards:
        mine = [await make_job(stores, due, pool, shard=shard) for _ in range(jobs)]
        await hot_window.add(shard, [Occurrence(j, ms_precision(due)) for j in mine])
        made += mine
    commits = GroupCommit(stores.dispatch)
    config = DispatcherConfig(shards=len(shards), mark_published_after_sec=0)
    leaders = [
        ShardDispatcher(
            shard,
            await stores.dispatch.take_shard(shard, "replica-a"),
            "replica-a",
            stores.dispatch,
            hot_window,
            publisher,
            config,
            commit=commits,
        )
        for shard in shards
    ]
    return leaders, commits, made


async def test_passes_claiming_together_are_gathered_into_one_transaction_and_each_job_is_published_once(
    stores: Stores,
    hot_window: HotWindow,
    publisher: KafkaPublisher,
    pool: str,
    kafka_bootstrap: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The gather waits for the passes still claiming at most GATHER_SEC (5 ms): unbounded here, so that a loaded
    # machine's slow Redis round trip cannot split the group; what is shown is what a group commits.
    monkeypatch.setattr(group_commit, "GATHER_SEC", 60.0)
    leaders, commits, jobs = await _leaders(stores, hot_window, publisher, pool, (0, 1, 2), jobs=3)

    results = await asyncio.gather(*(leader.run_once() for leader in leaders))

    assert [(r.claimed, r.dispatched, r.published) for r in results] == [(3, 3, 3)] * 3
    assert (commits.transactions, commits.passes) == (1, 3), "the passes that claimed together committed together"
    executions = await _executions_by_job(stores)
    assert sorted(executions) == sorted(jobs)
    tokens = {leader.shard: leader.token for leader in leaders}
    shard_of = {r["id"]: r["shard"] for r in await stores.database.pool.fetch("SELECT id, shard FROM jobs")}
    assert all(token == tokens[shard_of[job]] for job, (_, token) in executions.items()), "each under its own fence"
    assert await _published(kafka_bootstrap, pool, len(jobs)) == Counter(str(e) for e, _ in executions.values())
    assert [await hot_window.size(shard) for shard in (0, 1, 2)] == [0, 0, 0]


async def test_a_shared_transaction_that_fails_fails_every_pass_and_the_next_passes_dispatch_each_job_once(
    stores: Stores,
    hot_window: HotWindow,
    publisher: KafkaPublisher,
    pool: str,
    kafka_bootstrap: str,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(group_commit, "GATHER_SEC", 60.0)
    leaders, commits, jobs = await _leaders(stores, hot_window, publisher, pool, (0, 1, 2), jobs=3)
    # The shared transaction waits on shard 1's fence row, and its connection is then terminated (as by a
    # failover or an administrator): the whole transaction fails, Postgres keeps nothing of it.
    blocker = await asyncpg.connect(database_url)
    try:
        async with blocker.transaction():
            await blocker.execute("SELECT 1 FROM shard_fence WHERE shard = 1 FOR UPDATE")
            passes = asyncio.gather(*(leader.run_once() for leader in leaders), return_exceptions=True)
            deadline = asyncio.get_running_loop().time() + 30
            while not await blocker.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ):
                assert not passes.done(), passes.result()
                assert asyncio.get_running_loop().time() < deadline, "the shared transaction never waited"
                await asyncio.sleep(0.01)
            failed = await passes
    finally:
        await blocker.close()

    assert all(isinstance(f, asyncpg.PostgresError | asyncpg.InterfaceError) for f in failed), failed
    assert (commits.transactions, commits.passes) == (1, 3)
    assert await stores.database.pool.fetchval("SELECT count(*) FROM executions") == 0
    assert [await hot_window.size(shard) for shard in (0, 1, 2)] == [3, 3, 3], "every pass put its claims back"

    results = await asyncio.gather(*(leader.run_once() for leader in leaders))  # the same terms, Postgres back

    assert [r.dispatched for r in results] == [3, 3, 3]
    executions = await _executions_by_job(stores)
    assert sorted(executions) == sorted(jobs)
    assert await _published(kafka_bootstrap, pool, len(jobs)) == Counter(str(e) for e, _ in executions.values())
