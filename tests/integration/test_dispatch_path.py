"""The dispatch path on real Postgres, Redis and the broker: hydrator → dispatcher → Kafka, and the sweeper.

Components are driven one pass at a time through ``run_once()``, so nothing here
sleeps and hopes.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import asyncpg
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from opentelemetry import trace
from redis.asyncio import Redis
from sundial_common.broker.kafka import KafkaPublisher, ensure_topics
from sundial_common.broker.messages import ExecutionMessage, pool_topic
from sundial_common.domain.ids import new_id
from sundial_common.hotwindow.window import HotWindow
from sundial_common.observability.tracing import traceparent, tracer
from sundial_common.stores import Stores
from sundial_common.stores.dispatch import FencedOut, PlannedExecution
from sundial_common.stores.types import Occurrence, RetryDue
from sundial_common.testing import FakeClock
from sundial_dispatcher import group_commit
from sundial_dispatcher.dispatcher import DispatcherConfig, DispatchResult, ShardDispatcher
from sundial_dispatcher.group_commit import GroupCommit
from sundial_hydrator.hydrator import Hydrator, HydratorConfig
from sundial_sweeper.sweeper import Sweeper, SweeperConfig

from tests.support.hot_window import window_members
from tests.support.messages import execution_message, header


def ms_precision(instant: datetime) -> datetime:
    """Fire times are stored at millisecond precision, as the API writes them."""
    return instant.replace(microsecond=instant.microsecond // 1000 * 1000)


@pytest.fixture
async def hot_window(redis_url: str) -> AsyncIterator[HotWindow]:
    redis = Redis.from_url(redis_url)
    yield HotWindow(redis)
    await redis.aclose()


@pytest.fixture
def pool() -> str:
    # Topics outlive a test in the session's broker; a pool of its own keeps each test's messages apart.
    return f"t-{uuid.uuid4().hex[:10]}"


async def make_job(
    stores: Stores, due: datetime, pool: str, *, traceparent_value: str | None = None, shard: int = 0
) -> uuid.UUID:
    job_id = new_id()
    await stores.jobs.insert_job(
        {
            "id": job_id,
            "tenant_id": "acme",
            "name": "test",
            "type": "ONE_SHOT",
            "run_at": ms_precision(due),
            "pool": pool,
            "handler": "echo",
            "payload": {"n": str(job_id)},
            "timeout_sec": 30,
            "shard": shard,
            "next_fire_at": ms_precision(due),
            "traceparent": traceparent_value,
        },
        actor="test",
    )
    return job_id


def consume(bootstrap: str, topic: str, count: int, timeout: float = 15.0) -> list[ExecutionMessage]:
    """Read ``count`` messages from the start of ``topic`` (assigned partitions: no group join wait)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex}"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        messages: list[ExecutionMessage] = []
        deadline = datetime.now(UTC) + timedelta(seconds=timeout)
        while len(messages) < count and datetime.now(UTC) < deadline:
            for raw in consumer.consume(num_messages=count, timeout=0.5):
                value = raw.value()
                if raw.error() is None and value is not None:  # not the sweeper's markers (no value)
                    decoded = ExecutionMessage.decode(value)
                    assert header(raw, "execution_id").decode() == decoded.execution_id
                    assert int(header(raw, "fence_token")) == decoded.fence_token
                    assert header(raw, "tenant").decode() == decoded.tenant_id
                    messages.append(decoded)
        return messages
    finally:
        consumer.close()


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


async def test_dispatch_commits_one_execution_per_occurrence_and_publishes_it(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, pool: str, kafka_bootstrap: str
) -> None:
    due = datetime.now(UTC) - timedelta(milliseconds=10)
    jobs = [await make_job(stores, due, pool) for _ in range(5)]
    await hot_window.add(0, [Occurrence(j, ms_precision(due)) for j in jobs])
    config = DispatcherConfig(mark_published_after_sec=0)
    dispatcher = ShardDispatcher(0, 42, "replica-a", stores.dispatch, hot_window, publisher, config)

    result = await dispatcher.run_once()

    assert (result.claimed, result.dispatched, result.published) == (5, 5, 5)
    rows = await stores.database.pool.fetch("SELECT * FROM executions ORDER BY job_id")
    assert sorted(r["job_id"] for r in rows) == sorted(jobs)
    assert {(r["state"], r["fence_token"], r["attempt"]) for r in rows} == {("PENDING", 42, 1)}
    assert all(r["published_at"] is not None for r in rows)
    states = await stores.database.pool.fetch("SELECT state, next_fire_at FROM jobs")
    assert {(s["state"], s["next_fire_at"]) for s in states} == {("COMPLETED", None)}
    messages = consume(kafka_bootstrap, pool_topic(pool), 5)
    assert {m.execution_id for m in messages} == {str(r["id"]) for r in rows}
    assert all(m.fence_token == 42 and m.attempt == 1 and m.handler == "echo" for m in messages)

    # The same occurrence claimed again (a stale or re-added member) creates nothing.
    await hot_window.add(0, [Occurrence(jobs[0], ms_precision(due))])
    again = await dispatcher.run_once()
    assert (again.claimed, again.dispatched) == (1, 0)
    assert await stores.database.pool.fetchval("SELECT count(*) FROM executions") == 5


async def test_a_batch_published_at_once_goes_to_one_partition(
    publisher: KafkaPublisher, pool: str, kafka_bootstrap: str
) -> None:
    # One produce request for a dispatch pass's batch, not one per partition (the broker's cost follows requests).
    topic = pool_topic(pool)
    await asyncio.to_thread(ensure_topics, kafka_bootstrap, [topic], 4)
    await asyncio.to_thread(publisher.warm, [topic])  # as a dispatcher does (a cold producer spreads its first batch)
    batch = [execution_message(pool) for _ in range(40)]
    assert await publisher.publish(batch) == [None] * 40
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"probe-{uuid.uuid4().hex}"})
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(4)])
        received: list[Any] = []
        deadline = datetime.now(UTC) + timedelta(seconds=15)
        while len(received) < 40 and datetime.now(UTC) < deadline:
            received += [m for m in consumer.consume(num_messages=40, timeout=0.5) if m.error() is None]
    finally:
        consumer.close()
    assert sorted(ExecutionMessage.decode(m.value()).execution_id for m in received) == sorted(
        m.execution_id for m in batch
    )
    # One partition, unless this process was descheduled mid-batch for longer than the sticky window (4 ms), which
    # starts another request: a loaded CI machine has spread a batch over all four (13/12/11/4), each part a run
    # of consecutive messages. So what is asserted is that it was never spread message by message: along the
    # batch's order the partition changes only where a request ended, a few times, not at every message (39).
    partition_of = {ExecutionMessage.decode(m.value()).execution_id: m.partition() for m in received}
    order = [partition_of[m.execution_id] for m in batch]
    switches = sum(1 for a, b in pairwise(order) if a != b)
    assert switches <= 10, (switches, Counter(order))


async def test_published_at_is_marked_later_and_only_on_executions_still_waiting(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, pool: str
) -> None:
    due = datetime.now(UTC) - timedelta(milliseconds=10)
    waiting, started = await make_job(stores, due, pool), await make_job(stores, due, pool)
    await hot_window.add(0, [Occurrence(waiting, ms_precision(due)), Occurrence(started, ms_precision(due))])
    config = DispatcherConfig(mark_published_after_sec=0.2, mark_published_every_sec=0)
    dispatcher = ShardDispatcher(0, 42, "replica-a", stores.dispatch, hot_window, publisher, config)
    assert (await dispatcher.run_once()).published == 2
    rows = {r["job_id"]: r for r in await stores.database.pool.fetch("SELECT id, job_id, published_at FROM executions")}
    assert [r["published_at"] for r in rows.values()] == [None, None]  # not yet: one write saved per execution

    # A worker starts one first: its start records the message's broker timestamp.
    sent_at = datetime.now(UTC) - timedelta(milliseconds=5)
    assert len(await stores.executions.start_executions("w", [(rows[started]["id"], 1)], [sent_at])) == 1
    await asyncio.sleep(0.25)
    await dispatcher.run_once()  # nothing due; marks what was published 0.2 s ago

    after = {r["job_id"]: r["published_at"] for r in await stores.database.pool.fetch("SELECT * FROM executions")}
    assert after[started] == sent_at
    assert after[waiting] is not None and after[waiting] > sent_at


async def test_a_fenced_out_leader_writes_nothing(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, pool: str
) -> None:
    due = datetime.now(UTC) - timedelta(milliseconds=10)
    first, second = await make_job(stores, due, pool), await make_job(stores, due, pool)
    successor = ShardDispatcher(0, 200, "replica-b", stores.dispatch, hot_window, publisher, DispatcherConfig())
    stale = ShardDispatcher(0, 100, "replica-a", stores.dispatch, hot_window, publisher, DispatcherConfig())

    await hot_window.add(0, [Occurrence(first, ms_precision(due))])
    assert (await successor.run_once()).dispatched == 1
    await hot_window.add(0, [Occurrence(second, ms_precision(due))])
    with pytest.raises(FencedOut):
        await stale.run_once()

    assert await stores.database.pool.fetchval("SELECT count(*) FROM executions") == 1
    assert await stores.database.pool.fetchval("SELECT count(*) FROM executions WHERE fence_token = 100") == 0
    assert await stores.database.pool.fetchval("SELECT token FROM shard_fence WHERE shard = 0") == 200
    assert await stores.database.pool.fetchval("SELECT state FROM jobs WHERE id = $1", second) == "ACTIVE"


async def test_dispatch_continues_the_creating_requests_trace(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, pool: str, spans: object
) -> None:
    with tracer.start_as_current_span("POST /v1/jobs") as request_span:
        origin = traceparent()
    due = datetime.now(UTC) - timedelta(milliseconds=10)
    job_id = await make_job(stores, due, pool, traceparent_value=origin)
    await hot_window.add(0, [Occurrence(job_id, ms_precision(due))])

    await ShardDispatcher(0, 1, "replica-a", stores.dispatch, hot_window, publisher, DispatcherConfig()).run_once()

    row = await stores.database.pool.fetchrow("SELECT trace_id, traceparent FROM executions WHERE job_id = $1", job_id)
    request_trace = format(request_span.get_span_context().trace_id, "032x")
    assert row["trace_id"] == request_trace
    assert row["traceparent"].split("-")[1] == request_trace
    dispatch = [s for s in spans.get_finished_spans() if s.name == f"send {pool_topic(pool)}"]  # type: ignore[attr-defined]
    assert any(s.parent is not None and s.parent.span_id == request_span.get_span_context().span_id for s in dispatch)
    assert trace.get_tracer_provider() is not None


async def test_sweeper_republishes_executions_whose_message_was_never_sent(
    stores: Stores, publisher: KafkaPublisher, pool: str, kafka_bootstrap: str
) -> None:
    due = datetime.now(UTC) - timedelta(seconds=30)
    job_id = await make_job(stores, due, pool)
    # A dispatcher that committed and died before publishing leaves exactly this behind.
    execution_id = new_id()
    await stores.dispatch.dispatch(
        0,
        1,
        "replica-a",
        [Occurrence(job_id, ms_precision(due))],
        lambda jobs: [PlannedExecution(execution_id, j, None, None) for j in jobs],
    )
    await stores.database.pool.execute("UPDATE executions SET created_at = now() - interval '1 minute'")
    sweeper = Sweeper(stores, publisher, SweeperConfig(unpublished_after_sec=5))

    assert (await sweeper.run_once()).republished == 1
    assert (await sweeper.run_once()).republished == 0  # published now; not sent again right away
    messages = consume(kafka_bootstrap, pool_topic(pool), 1)
    assert [m.execution_id for m in messages] == [str(execution_id)]


async def test_each_term_takes_a_larger_token_from_postgres_and_fences_out_the_one_before(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, pool: str
) -> None:
    # A fence recorded from an etcd revision (before tokens came from Postgres), or from an etcd since rebuilt:
    # a new term's token continues above it, whatever etcd's revisions are now.
    await stores.database.pool.execute("INSERT INTO shard_fence (shard, token, holder) VALUES (0, 5828, 'old')")
    first = await stores.dispatch.take_shard(0, "replica-a")
    second = await stores.dispatch.take_shard(0, "replica-b")
    assert (first, second) == (5829, 5830)
    assert await stores.dispatch.take_shard(1, "replica-a") == 1, "a shard never led starts at 1"

    due = datetime.now(UTC) - timedelta(milliseconds=10)
    job = await make_job(stores, due, pool)
    await hot_window.add(0, [Occurrence(job, ms_precision(due))])
    stale = ShardDispatcher(0, first, "replica-a", stores.dispatch, hot_window, publisher, DispatcherConfig())
    with pytest.raises(FencedOut):
        await stale.run_once()
    # The fenced-out pass gave its claim back: the current term dispatches it at once.
    assert await hot_window.size(0) == 1
    current = ShardDispatcher(0, second, "replica-b", stores.dispatch, hot_window, publisher, DispatcherConfig())
    assert (await current.run_once()).dispatched == 1
    assert await stores.database.pool.fetchval("SELECT fence_token FROM executions WHERE job_id = $1", job) == second


async def test_a_pass_whose_transaction_fails_puts_its_claim_back(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, pool: str
) -> None:
    due = datetime.now(UTC) - timedelta(milliseconds=10)
    jobs = [await make_job(stores, due, pool) for _ in range(3)]
    await hot_window.add(0, [Occurrence(j, ms_precision(due)) for j in jobs])

    class Unreachable:
        """The dispatch store, except that the dispatch transaction cannot reach Postgres."""

        def __getattr__(self, name: str) -> object:
            return getattr(stores.dispatch, name)

        def occurrence_transaction(self, *args: object) -> None:
            raise ConnectionRefusedError("Postgres is restarting")

    broken = ShardDispatcher(0, 1, "replica-a", stores.dispatch, hot_window, publisher, DispatcherConfig())
    broken.store = Unreachable()  # type: ignore[assignment]
    with pytest.raises(ConnectionRefusedError):
        await broken.run_once()

    assert await hot_window.size(0) == 3, "the claimed members are back in the hot window at once"
    healed = ShardDispatcher(0, 1, "replica-a", stores.dispatch, hot_window, publisher, DispatcherConfig())
    assert (await healed.run_once()).dispatched == 3


async def test_warming_the_dispatch_connections_writes_nothing(stores: Stores, pool: str) -> None:
    await stores.dispatch.warm(3)
    assert await stores.database.pool.fetchval("SELECT count(*) FROM shard_fence") == 0
    assert await stores.database.pool.fetchval("SELECT count(*) FROM executions") == 0
    assert await stores.database.pool.fetchval("SELECT count(*) FROM audit_log") == 0
    # And the warmed connections dispatch as any other.
    job_id = await make_job(stores, datetime.now(UTC) - timedelta(seconds=1), pool)
    token = await stores.dispatch.take_shard(0, "replica-a")
    claims = [Occurrence(job_id, ms_precision(datetime.now(UTC)))]
    created = await stores.dispatch.dispatch(
        0, token, "replica-a", claims, lambda jobs: [PlannedExecution(new_id(), j, None, None) for j in jobs]
    )
    assert [p.job["id"] for p in created] == [job_id]


async def test_warming_a_workers_start_connections_writes_nothing(stores: Stores, pool: str) -> None:
    await stores.executions.warm_starts(3)
    assert stores.database.pool.get_size() >= 3, "the connections stay open for the first starts"
    for table in ("executions", "execution_attempts", "audit_log"):
        assert await stores.database.pool.fetchval(f"SELECT count(*) FROM {table}") == 0
    # And a warmed connection starts an execution as any other.
    job_id = await make_job(stores, datetime.now(UTC) - timedelta(seconds=1), pool)
    token = await stores.dispatch.take_shard(0, "replica-a")
    claims = [Occurrence(job_id, ms_precision(datetime.now(UTC)))]
    (created,) = await stores.dispatch.dispatch(
        0, token, "replica-a", claims, lambda jobs: [PlannedExecution(new_id(), j, None, None) for j in jobs]
    )
    started = await stores.executions.start_executions("w", [(created.execution_id, 1)], [None])
    assert [row["id"] for row in started] == [created.execution_id]


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
