"""Weighted fair dispatch through the real dispatch pass (Postgres, Redis, the broker): a tenant behind
another's burst is served in the first pass, saturated tenants share by weight, a pool's queue stays short
and a tenant's concurrency quota holds its work back — late, never lost; inside a tenant, HIGH goes first."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import TypedDict, Unpack, cast

import pytest
from redis.asyncio import Redis
from sundial_common.broker.kafka import KafkaPublisher
from sundial_common.domain.ids import new_id
from sundial_common.hotwindow.rate_limits import TokenBuckets
from sundial_common.hotwindow.window import HotWindow
from sundial_common.hotwindow.worker_announcements import WorkerAnnouncement
from sundial_common.stores import Stores
from sundial_common.stores.tenants import TenantStore
from sundial_common.stores.types import Occurrence, RetryDue
from sundial_common.testing import FakeClock
from sundial_dispatcher.dispatcher import DispatcherConfig, ShardDispatcher
from sundial_dispatcher.fairness import FairDispatch, FairnessConfig, OpenWork
from sundial_dispatcher.tenancy import TenantPolicy

from tests.support.pools import admit
from tests.support.tenants import register_tenant

DUE = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)


@pytest.fixture
async def hot_window(redis_url: str) -> AsyncIterator[HotWindow]:
    redis = Redis.from_url(redis_url)
    yield HotWindow(redis)
    await redis.aclose()


async def due_jobs(
    stores: Stores,
    hot_window: HotWindow,
    tenant: str,
    n: int,
    pool: str,
    priority: str = "NORMAL",
    due: datetime = DUE,
) -> None:
    ids = [new_id() for _ in range(n)]
    rows = [
        {
            "id": job_id,
            "tenant_id": tenant,
            "name": "burst",
            "type": "ONE_SHOT",
            "run_at": due,
            "pool": pool,
            "handler": "echo",
            "timeout_sec": 30,
            "shard": 0,
            "next_fire_at": due,
            "priority": priority,
        }
        for job_id in ids
    ]
    await stores.jobs.insert_jobs(rows, actor="test")
    await hot_window.add(0, [Occurrence(job_id, due) for job_id in ids])


class Fairness(TypedDict, total=False):
    """The fairness settings these tests vary (the rest keep FairnessConfig's defaults)."""

    pool_queue_cap: int
    pool_queue_min: int
    claim_size: int
    claim_ahead_sec: float
    claim_ahead_min: int
    burst_ahead_sec: float
    burst_ahead_min: int
    burst_head: int


def dispatcher(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, batch: int, **fairness: Unpack[Fairness]
) -> ShardDispatcher:
    # Counts read afresh every pass: the test changes executions between passes. A fixed pool cap (the
    # rate-following one has tests of its own in tests/unit/dispatcher/test_open_work.py).
    fairness.setdefault("pool_queue_min", fairness.get("pool_queue_cap", FairnessConfig.pool_queue_cap))
    config = DispatcherConfig(batch_size=batch, fairness=FairnessConfig(counts_refresh_sec=0, **fairness))
    policy = TenantPolicy(stores.tenants, refresh_sec=0)
    fair = FairDispatch(0, hot_window, stores.tenants, policy, TokenBuckets(hot_window.redis), config.fairness, batch)
    return ShardDispatcher(0, 1, "replica-a", stores.dispatch, hot_window, publisher, config, tenants=policy, fair=fair)


async def dispatched(stores: Stores) -> Counter[str]:
    rows = await stores.database.pool.fetch("SELECT tenant_id FROM executions")
    return Counter(r["tenant_id"] for r in rows)


async def test_a_small_tenant_is_served_in_the_first_pass_and_saturated_ones_share_by_weight(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, database_url: str
) -> None:
    pool = f"fair-{uuid.uuid4().hex[:8]}"
    await register_tenant(database_url, "big", weight=1)
    await register_tenant(database_url, "small", weight=1)
    await register_tenant(database_url, "heavy", weight=3)
    await due_jobs(stores, hot_window, "big", 2000, pool)  # created first: earliest in the hot window
    await due_jobs(stores, hot_window, "small", 20, pool)
    await due_jobs(stores, hot_window, "heavy", 2000, pool)
    # One claim takes the whole window into the leader's buffer (a pass claims up to claim_size).
    shard = dispatcher(stores, hot_window, publisher, batch=100, pool_queue_cap=100_000, claim_size=10_000)

    first = await shard.run_once()
    assert first.dispatched == 100
    after_one = await dispatched(stores)
    assert after_one["small"] == 20  # all of it, in the first pass, behind 2,000 of big's
    for _ in range(4):
        await shard.run_once()
    counts = await dispatched(stores)
    # 480 more of big's and heavy's after small's 20: weights 1:3 (±1 turn per pass).
    assert counts["big"] + counts["heavy"] == 480
    assert abs(counts["heavy"] - 3 * counts["big"]) <= 8, counts


async def test_a_pool_queue_stays_short_and_a_concurrency_quota_holds_work_back(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, database_url: str
) -> None:
    pool, other = f"fair-{uuid.uuid4().hex[:8]}", f"fair-{uuid.uuid4().hex[:8]}"
    await register_tenant(database_url, "a")
    await register_tenant(database_url, "capped", max_concurrent_executions=30)
    await due_jobs(stores, hot_window, "a", 500, pool)
    await due_jobs(stores, hot_window, "capped", 100, other)
    shard = dispatcher(stores, hot_window, publisher, batch=100, pool_queue_cap=150)

    for _ in range(5):
        await shard.run_once()
    counts = await dispatched(stores)
    assert counts == {"a": 150, "capped": 30}  # nobody started them: the rest waits in the leader's buffer
    # Executions start and finish: the pool drains and the quota frees, so the waiting work goes out.
    await stores.database.pool.execute("UPDATE executions SET state = 'SUCCEEDED', finished_at = now()")
    for _ in range(3):
        await shard.run_once()
    assert await dispatched(stores) == {"a": 300, "capped": 60}


async def test_what_a_term_claimed_and_did_not_dispatch_goes_back_to_the_hot_window(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, database_url: str
) -> None:
    await register_tenant(database_url, "a")
    await due_jobs(stores, hot_window, "a", 300, f"fair-{uuid.uuid4().hex[:8]}")
    shard = dispatcher(stores, hot_window, publisher, batch=100, pool_queue_cap=100_000)
    await shard.run_once()
    assert await hot_window.size(0) == 0 and shard.fair is not None and len(shard.fair.queue) == 200
    # Held, not lost: the hydrator's overdue scan leaves the buffered jobs alone (and the dispatched ones).
    buffered = [w.occurrence for q in shard.fair.queue.queues.values() for w in q]
    assert await hot_window.not_held(0, buffered) == []
    assert await shard.fair.release() == 200
    assert await hot_window.size(0) == 200 and len(shard.fair.queue) == 0
    assert await hot_window.not_held(0, buffered) == buffered  # the next leader holds nothing yet


async def test_a_burst_is_claimed_before_it_is_due_and_dispatched_when_it_falls_due(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, database_url: str
) -> None:
    await register_tenant(database_url, "a")
    pool = f"fair-{uuid.uuid4().hex[:8]}"
    soon = (datetime.now(UTC) + timedelta(seconds=3)).replace(microsecond=0)  # ms precision, as the API stores
    await due_jobs(stores, hot_window, "a", 100, pool, due=soon)
    await due_jobs(stores, hot_window, "a", 10, pool, due=soon + timedelta(seconds=60))  # beyond the lookahead
    quiet = dispatcher(stores, hot_window, publisher, batch=100, claim_ahead_sec=10, claim_ahead_min=101)
    burst = dispatcher(stores, hot_window, publisher, batch=100, claim_ahead_sec=10, claim_ahead_min=100)

    await quiet.run_once()
    assert await hot_window.size(0) == 110, "fewer due within the lookahead than the threshold: nothing taken early"
    result = await burst.run_once()
    assert result.dispatched == 0 and await dispatched(stores) == {}, "claimed ahead, never dispatched early"
    assert burst.fair is not None and len(burst.fair.early) == 100 and await hot_window.size(0) == 10
    early = [w.occurrence for w in burst.fair.early]
    assert await hot_window.not_held(0, early) == [], "held: the hydrator's overdue scan leaves them alone"

    await asyncio.sleep(max(0.0, (soon - datetime.now(UTC)).total_seconds()))
    head = await burst.run_once()
    assert head.dispatched == 16 and head.again, "the burst's head first (a small transaction), the rest at once"
    rest = await burst.run_once()
    assert rest.dispatched == 84 and not rest.again
    assert await dispatched(stores) == {"a": 100} and not burst.fair.early
    assert await hot_window.not_held(0, early) == early, "dispatched: no longer held"


async def test_a_smaller_burst_is_claimed_ahead_over_the_shorter_horizon(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, database_url: str
) -> None:
    await register_tenant(database_url, "a")
    pool = f"fair-{uuid.uuid4().hex[:8]}"
    soon = (datetime.now(UTC) + timedelta(seconds=3)).replace(microsecond=0)
    await due_jobs(stores, hot_window, "a", 50, pool, due=soon)
    # Far below the long horizon's count; the short horizon's (10 s here, so a loaded machine keeps it ahead).
    # The whole burst in one pass (no head: the test above has it).
    fairness: Fairness = {"claim_ahead_sec": 10, "claim_ahead_min": 10_000, "burst_ahead_sec": 10, "burst_head": 0}
    just_above: Fairness = {**fairness, "burst_ahead_min": 51}
    just_at: Fairness = {**fairness, "burst_ahead_min": 50}
    quiet = dispatcher(stores, hot_window, publisher, batch=100, **just_above)
    burst = dispatcher(stores, hot_window, publisher, batch=100, **just_at)

    await quiet.run_once()
    assert await hot_window.size(0) == 50, "fewer due within the short horizon than its threshold: nothing early"
    assert (await burst.run_once()).dispatched == 0 and await dispatched(stores) == {}
    assert burst.fair is not None and len(burst.fair.early) == 50 and await hot_window.size(0) == 0
    await asyncio.sleep(max(0.0, (soon - datetime.now(UTC)).total_seconds()))
    assert (await burst.run_once()).dispatched == 50


async def test_what_a_contended_pass_kept_for_its_instant_goes_out_with_the_next_lead_once_it_fits(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, database_url: str
) -> None:
    # A sparse stream's pass takes what falls due within the publish lead and sends it ahead, unless the pool's
    # room is short: then it keeps it for its instant. The pass at that instant must not keep the next lead's
    # members in turn (a whole stream would go out at each instant, late by a pass, until a pass claimed nothing).
    await register_tenant(database_url, "a")
    pool = f"fair-{uuid.uuid4().hex[:8]}"
    t0 = (datetime.now(UTC) + timedelta(minutes=2)).replace(microsecond=0)
    ms = timedelta(milliseconds=1)
    for due in (t0, t0 + 10 * ms, t0 + 20 * ms):
        await due_jobs(stores, hot_window, "a", 1, pool, due=due)
    # A pass of at most a burst head's worth may go out whole to a pool not seen yet: a head of 2 keeps the room short.
    fairness = FairnessConfig(counts_refresh_sec=0, pool_queue_cap=2, pool_queue_min=2, burst_head=2)
    config = DispatcherConfig(batch_size=100, publish_lead_sec=0.2, fairness=fairness)
    policy = TenantPolicy(stores.tenants, refresh_sec=0)
    fair = FairDispatch(0, hot_window, stores.tenants, policy, TokenBuckets(hot_window.redis), fairness, 100)
    clock = FakeClock(t0 - 150 * ms)
    shard = ShardDispatcher(
        0, 1, "replica-a", stores.dispatch, hot_window, publisher, config, clock=clock, tenants=policy, fair=fair
    )

    assert (await shard.run_once()).dispatched == 0, "three within the lead, room for two: kept for their instants"
    await due_jobs(stores, hot_window, "a", 1, pool, due=t0 + 100 * ms)
    clock.set(t0)
    assert (await shard.run_once()).dispatched == 2, "the first kept one, due, with the next lead's member"
    fired = await stores.database.pool.fetch("SELECT fire_at FROM executions ORDER BY fire_at")
    assert [r["fire_at"] for r in fired] == [t0, t0 + 100 * ms]


async def test_a_sparse_pass_of_a_few_members_goes_out_ahead_though_an_unseen_pools_room_is_one_a_shard(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, database_url: str
) -> None:
    # The defaults over 8 shards: a pool not seen yet has room for ceil(8 / 8) = 1 in a shard's pass. Held to it,
    # every gathered pass of a steady stream was contended, and its members waited for their instants.
    await register_tenant(database_url, "a")
    pool = f"fair-{uuid.uuid4().hex[:8]}"
    t0 = (datetime.now(UTC) + timedelta(minutes=2)).replace(microsecond=0)
    ms = timedelta(milliseconds=1)
    for due in (t0, t0 + 60 * ms, t0 + 120 * ms):
        await due_jobs(stores, hot_window, "a", 1, pool, due=due)
    fairness = FairnessConfig(counts_refresh_sec=0)
    config = DispatcherConfig(batch_size=100, publish_lead_sec=0.2, gather_sec=0.2, fairness=fairness)
    policy = TenantPolicy(stores.tenants, refresh_sec=0)
    fair = FairDispatch(0, hot_window, stores.tenants, policy, TokenBuckets(hot_window.redis), fairness, 100, 8)
    clock = FakeClock(t0 - 200 * ms)
    shard = ShardDispatcher(
        0, 1, "replica-a", stores.dispatch, hot_window, publisher, config, clock=clock, tenants=policy, fair=fair
    )
    assert (await shard.run_once()).dispatched == 3, "one pass, sent ahead: their workers hold them until due"


class _Announced:
    """Live workers of 256 free slots announced for each of ``pools``."""

    def __init__(self, *pools: str) -> None:
        self.pools = pools

    async def live_pools(self, pools: Sequence[str] | None = None) -> dict[str, list[WorkerAnnouncement]]:
        at = datetime.now(UTC)
        return {p: [WorkerAnnouncement("w", p, ("echo",), 256, 256, "1", "host", 1, at)] for p in self.pools}


class _Owners:
    """The tenant store, counting the fair pass's lookups of whose each claimed job is."""

    def __init__(self, store: TenantStore) -> None:
        self._store = store
        self.lookups = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    async def job_owners(self, job_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, tuple[str, str, str]]:
        self.lookups += 1
        return await self._store.job_owners(job_ids)


@pytest.mark.parametrize("idle_pool", [False, True], ids=["every-pool-seen", "an-idle-pool-registered"])
async def test_a_dense_pass_goes_out_whole_unless_a_registered_pool_has_no_room_of_its_own(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, database_url: str, idle_pool: bool
) -> None:
    # 24 members in one pass: more than a burst head (16), within the pool's room (256 free slots over 8 shards: 32
    # a shard's pass). With every registered pool seen (live workers here) none can be in a pool with no room of its
    # own, so the pass is sent ahead without the owners' lookup. A registered pool with no worker and nothing open
    # could be theirs: the pass is looked up and its members held for their instants.
    await register_tenant(database_url, "a")
    pool = admit(database_url, f"fair-{uuid.uuid4().hex[:8]}", "a")
    if idle_pool:
        admit(database_url, f"idle-{uuid.uuid4().hex[:8]}", "a")
    t0 = (datetime.now(UTC) + timedelta(minutes=2)).replace(microsecond=0)
    for i in range(24):
        await due_jobs(stores, hot_window, "a", 1, pool, due=t0 + i * timedelta(milliseconds=3))
    fairness = FairnessConfig(counts_refresh_sec=0)
    config = DispatcherConfig(batch_size=100, publish_lead_sec=0.2, gather_sec=0.2, fairness=fairness)
    policy = TenantPolicy(stores.tenants, refresh_sec=0)
    owners = _Owners(stores.tenants)
    open_work = OpenWork(cast(TenantStore, owners), fairness, live=_Announced(pool))
    buckets = TokenBuckets(hot_window.redis)
    fair = FairDispatch(0, hot_window, cast(TenantStore, owners), policy, buckets, fairness, 100, 8, open_work)
    clock = FakeClock(t0 - timedelta(milliseconds=200))
    shard = ShardDispatcher(
        0, 1, "replica-a", stores.dispatch, hot_window, publisher, config, clock=clock, tenants=policy, fair=fair
    )
    dispatched = (await shard.run_once()).dispatched
    if idle_pool:
        assert (dispatched, owners.lookups) == (0, 1), "looked up and held for their instants"
    else:
        assert (dispatched, owners.lookups) == (24, 0), "one pass, sent ahead, nobody looked up"


class _CountsUnreadable:
    """The tenant store with Postgres gone for the counts' read (the claim from Redis already happened)."""

    def __init__(self, store: object) -> None:
        self._store = store

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    async def open_executions(self, queued_within_sec: float, fresh_within_sec: float | None = None) -> list[object]:
        raise ConnectionRefusedError("postgres is restarting")


async def test_a_pass_whose_reads_fail_puts_back_what_it_claimed_at_once(
    stores: Stores, hot_window: HotWindow, database_url: str
) -> None:
    await register_tenant(database_url, "a")
    await due_jobs(stores, hot_window, "a", 50, f"fair-{uuid.uuid4().hex[:8]}")
    policy = TenantPolicy(stores.tenants, refresh_sec=0)
    unreadable = _CountsUnreadable(stores.tenants)
    fair = FairDispatch(0, hot_window, unreadable, policy, TokenBuckets(hot_window.redis), FairnessConfig(), 100)  # type: ignore[arg-type]
    with pytest.raises(ConnectionRefusedError):
        await fair.claim(datetime.now(UTC))
    # Back in the hot window, not only in Postgres (where the hydrator's overdue scan would find them later).
    assert await hot_window.size(0) == 50 and len(fair.queue) == 0


async def test_a_tenants_high_work_goes_out_ahead_of_its_low_backlog_and_executions_keep_their_priority(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, database_url: str
) -> None:
    pool = f"fair-{uuid.uuid4().hex[:8]}"
    await register_tenant(database_url, "a")
    await due_jobs(stores, hot_window, "a", 300, pool, priority="LOW")
    shard = dispatcher(stores, hot_window, publisher, batch=100, pool_queue_cap=100)
    await shard.run_once()  # 100 LOW out, the pool's queue is full, 200 wait in the buffer
    await due_jobs(stores, hot_window, "a", 20, pool, priority="HIGH")
    await shard.run_once()  # the queue is still full: the HIGH jobs are claimed and wait too
    await stores.database.pool.execute("UPDATE executions SET state = 'SUCCEEDED', finished_at = now()")
    await shard.run_once()
    rows = await stores.database.pool.fetch(
        "SELECT e.priority, j.priority AS job_priority FROM executions e JOIN jobs j ON j.id = e.job_id"
    )
    assert all(r["priority"] == r["job_priority"] for r in rows)
    # All 20 HIGH in the next 100, ahead of the 200 LOW that waited longer (a tenth of the takes still goes
    # to the oldest LOW).
    assert Counter(r["priority"] for r in rows) == {"LOW": 180, "HIGH": 20}


async def dead_executions_due_for_retry(stores: Stores, hot_window: HotWindow, tenant: str, n: int, pool: str) -> None:
    """``n`` DEAD executions of one completed job, made an hour ago and each re-driven (a retry due now), as a bulk
    re-drive leaves them."""
    job = new_id()
    await stores.database.pool.execute(
        "INSERT INTO jobs (id, tenant_id, name, type, pool, handler, timeout_sec, state, shard)"
        " VALUES ($1, $2, 'victims', 'ONE_SHOT', $3, 'echo', 30, 'COMPLETED', 0)",
        job,
        tenant,
        pool,
    )
    ids = [new_id() for _ in range(n)]
    await stores.database.pool.execute(
        "INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler, state,"
        " attempt, max_attempts, timeout_sec, finished_at, next_attempt_at, created_at)"
        " SELECT e.id, $1, $2, $3::timestamptz - e.i * interval '1 millisecond', 0, 1, $4, 'echo', 'DEAD', 3, 3, 30,"
        " $3, $3, $3::timestamptz - interval '1 hour' FROM unnest($5::uuid[]) WITH ORDINALITY AS e (id, i)",
        tenant,
        job,
        DUE,
        pool,
        ids,
    )
    await hot_window.add_retries(0, [RetryDue(i, DUE) for i in ids])


async def test_a_re_drives_retries_wait_their_turn_behind_another_tenants_jobs_in_a_full_pool(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, database_url: str
) -> None:
    pool = f"fair-{uuid.uuid4().hex[:8]}"
    await register_tenant(database_url, "redriver")
    await register_tenant(database_url, "other")
    await dead_executions_due_for_retry(stores, hot_window, "redriver", 500, pool)  # earliest in the hot window
    await due_jobs(stores, hot_window, "other", 20, pool)
    shard = dispatcher(stores, hot_window, publisher, batch=100, pool_queue_cap=100)

    first = await shard.run_once()
    # The other tenant's 20 go out in the first pass, beside 25 of the re-drive's: retries take their turns of the
    # round robin, and at most a quarter of the pool's queue (FairnessConfig.retry_queue_share), the rest is kept
    # for the scheduled work.
    assert first.dispatched == 20 and first.retried == 25
    # The pool's queue is full (the retries count in it from when they became PENDING, not from their creation an
    # hour ago): the rest of the re-drive waits in the buffer, not in the topic.
    await shard.run_once()
    assert await dispatched(stores) == {"other": 20, "redriver": 500}  # (its rows exist: they are the executions)
    pending = await stores.database.pool.fetchval("SELECT count(*) FROM executions WHERE state = 'PENDING'")
    assert pending == 45
    assert shard.fair is not None and len(shard.fair.queue) == 475
    # Held, not lost: the hydrator's overdue scan leaves them alone; a term that ends puts them back.
    waiting = [RetryDue(w.occurrence.job_id, w.occurrence.due) for q in shard.fair.queue.queues.values() for w in q]
    assert await hot_window.retries_not_held(0, waiting) == []
    assert await shard.fair.release() == 475
    assert await hot_window.size(0) == 475
    # Attempts go on where they were: each re-driven execution once, with its next attempt number.
    await stores.database.pool.execute("UPDATE executions SET state = 'SUCCEEDED', finished_at = now()")
    attempts = await stores.database.pool.fetch(
        "SELECT attempt, count(*) AS n FROM executions WHERE tenant_id = 'redriver' GROUP BY attempt"
    )
    assert {r["attempt"]: r["n"] for r in attempts} == {4: 25, 3: 475}


async def test_another_tenants_first_fire_keeps_its_publish_lead_while_a_re_drives_retries_wait(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, database_url: str
) -> None:
    # Retries waiting on their shard for their share of the pool's room made every pass there contended: the other
    # tenant's jobs then lost their publish lead and went out only at (after) their due instant, by the next pass.
    pool = f"fair-{uuid.uuid4().hex[:8]}"
    await register_tenant(database_url, "redriver")
    await register_tenant(database_url, "other")
    await dead_executions_due_for_retry(stores, hot_window, "redriver", 500, pool)
    t0 = (datetime.now(UTC) + timedelta(minutes=2)).replace(microsecond=0)
    fairness = FairnessConfig(counts_refresh_sec=0, pool_queue_cap=100, pool_queue_min=100)
    config = DispatcherConfig(batch_size=100, publish_lead_sec=0.2, fairness=fairness)
    policy = TenantPolicy(stores.tenants, refresh_sec=0)
    fair = FairDispatch(0, hot_window, stores.tenants, policy, TokenBuckets(hot_window.redis), fairness, 100)
    clock = FakeClock(t0 - timedelta(seconds=1))
    shard = ShardDispatcher(
        0, 1, "replica-a", stores.dispatch, hot_window, publisher, config, clock=clock, tenants=policy, fair=fair
    )
    assert (await shard.run_once()).retried == 25  # their share of the pool's queue; 475 wait in the buffer
    # Their workers ran them: the pool's queue has room again.
    await stores.database.pool.execute(
        "UPDATE executions SET state = 'SUCCEEDED', finished_at = now() WHERE state = 'PENDING'"
    )

    await due_jobs(stores, hot_window, "other", 1, pool, due=t0)
    clock.set(t0 - timedelta(milliseconds=150))
    second = await shard.run_once()
    # Committed (and sent) 150 ms before it is due, its worker holding it until then; the re-drive's retries took
    # their turn in the same pass, as many as the round robin gives them beside it.
    assert (second.dispatched, second.retried) == (1, 25)
    fired = await stores.database.pool.fetchval("SELECT fire_at FROM executions WHERE tenant_id = 'other'")
    assert fired == t0
    assert len(fair.queue) == 450 and fair.queue.only_retries()
    attempts = await stores.database.pool.fetchval(
        "SELECT count(*) FROM executions WHERE tenant_id = 'redriver' AND attempt = 4"
    )
    assert attempts == 50
