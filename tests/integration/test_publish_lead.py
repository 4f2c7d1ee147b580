"""Publishing ahead of the due instant (``DispatcherConfig.publish_lead_sec``), the dispatcher's and the API's side:
what a pass takes early, what its messages say, and what a pause or cancel of the job does to such an execution.

The dispatcher runs one pass at a time under a clock the test moves (the recurring jobs' tests' helpers); the jobs are
due about two minutes after the real time, so Postgres's ``now()`` is before their due instants.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sundial_common.broker.kafka import KafkaPublisher
from sundial_common.broker.messages import pool_topic
from sundial_common.hotwindow.window import HotWindow
from sundial_common.stores import Stores
from sundial_common.testing import FakeClock
from sundial_dispatcher.dispatcher import DispatcherConfig, ShardDispatcher

from tests.integration.test_recurring_dispatch import MINUTE, T0, at, executions, make_job
from tests.support.dispatch import consume, hot_window, pool

__all__ = ["hot_window", "pool"]  # fixtures

LEAD = DispatcherConfig(publish_lead_sec=0.2)
LEAD_DELTA = timedelta(seconds=LEAD.publish_lead_sec)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def ahead(stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, clock: FakeClock) -> ShardDispatcher:
    return ShardDispatcher(0, 1, "replica-a", stores.dispatch, hot_window, publisher, LEAD, clock=clock)


async def test_a_pass_dispatches_what_falls_due_within_the_lead_and_its_message_carries_the_due_instant(
    stores: Stores,
    hot_window: HotWindow,
    ahead: ShardDispatcher,
    clock: FakeClock,
    pool: str,
    kafka_bootstrap: str,
) -> None:
    soon = await make_job(stores, hot_window, pool)
    later = await make_job(stores, hot_window, pool, first=T0 + MINUTE)

    result = await at(clock, ahead, T0 - timedelta(milliseconds=150))

    assert result.dispatched == 1
    [row] = await executions(stores, soon)
    assert (row["state"], row["fire_at"]) == ("PENDING", T0)
    assert await executions(stores, later) == []
    [message] = consume(kafka_bootstrap, pool_topic(pool), 1)
    assert message.execution_id == str(row["id"])
    assert message.due_at == T0.isoformat()  # the worker holds it until then

    # Published at (or after) its due instant, a message says nothing: the worker starts it on receipt.
    assert (await at(clock, ahead, T0 + MINUTE)).dispatched == 2  # the later job, and the first one's next fire
    due_at = {m.execution_id: m.due_at for m in consume(kafka_bootstrap, pool_topic(pool), 3)}
    assert due_at.pop(message.execution_id) == T0.isoformat()
    assert list(due_at.values()) == [None, None]


@pytest.mark.parametrize("operation", ["pause_job", "cancel_job"])
async def test_pausing_or_cancelling_a_job_withdraws_its_execution_dispatched_ahead_not_one_already_due(
    stores: Stores, hot_window: HotWindow, ahead: ShardDispatcher, clock: FakeClock, pool: str, operation: str
) -> None:
    # Due after Postgres's now() whenever this runs (the module's T0 is two minutes after collection, and the
    # suite may reach this test later than that): the withdrawal compares the due instant with now().
    t0 = datetime.now(UTC).replace(second=0, microsecond=0) + 2 * MINUTE
    past = t0 - 5 * MINUTE  # due before Postgres's now(): dispatched at its instant, as without a lead
    ahead_job = await make_job(stores, hot_window, pool, first=t0)
    due_job = await make_job(stores, hot_window, pool, first=past, schedule="0 0 1 1 *")  # its next: far off
    assert (await at(clock, ahead, past)).dispatched == 1
    assert (await at(clock, ahead, t0 - timedelta(milliseconds=100))).dispatched == 1
    [early] = await executions(stores, ahead_job)
    [due] = await executions(stores, due_job)

    change: Any = getattr(stores.jobs, operation)
    assert await change("acme", ahead_job, "test") is not None
    assert await change("acme", due_job, "test") is not None

    withdrawn = await stores.database.pool.fetchrow("SELECT * FROM executions WHERE id = $1", early["id"])
    assert withdrawn["state"] == "CANCELLED"
    assert "before the execution was due" in withdrawn["error"]
    # Its message is out already: the worker's start CAS loses, and the handler never runs.
    assert await stores.executions.start_executions("w", [(early["id"], 1)], [None]) == []
    untouched = await stores.database.pool.fetchrow("SELECT state FROM executions WHERE id = $1", due["id"])
    assert untouched["state"] == "PENDING"
    audit = await stores.database.pool.fetch(
        "SELECT action, to_state FROM audit_log WHERE entity = 'execution' AND entity_id = $1 ORDER BY id",
        early["id"],
    )
    assert [(a["action"], a["to_state"]) for a in audit][-1] == ("cancel", "CANCELLED")


async def test_a_dense_shard_takes_nothing_ahead(
    stores: Stores, hot_window: HotWindow, ahead: ShardDispatcher, clock: FakeClock, pool: str
) -> None:
    # Its workers would release what one pass sent together one due instant at a time, a start CAS each.
    job_id = await make_job(stores, hot_window, pool)
    ahead.sparse(False)
    assert (await at(clock, ahead, T0 - timedelta(milliseconds=150))).dispatched == 0
    assert ahead.next_look() == T0
    ahead.sparse(True)
    assert ahead.next_look() == T0 - LEAD_DELTA
    assert (await at(clock, ahead, T0 - timedelta(milliseconds=150))).dispatched == 1
    assert len(await executions(stores, job_id)) == 1


async def test_a_sparse_pass_takes_what_comes_due_within_the_gather_after_the_earliest_member(
    stores: Stores, hot_window: HotWindow, publisher: KafkaPublisher, clock: FakeClock, pool: str, kafka_bootstrap: str
) -> None:
    # One pass, one dispatch transaction and one produce for the members of the next few hundred milliseconds; each
    # message carries its own due instant, which its worker holds it until.
    config = DispatcherConfig(publish_lead_sec=0.2, gather_sec=0.2)
    gathering = ShardDispatcher(0, 1, "replica-a", stores.dispatch, hot_window, publisher, config, clock=clock)
    first = await make_job(stores, hot_window, pool)
    soon = await make_job(stores, hot_window, pool, first=T0 + timedelta(milliseconds=150))
    later = await make_job(stores, hot_window, pool, first=T0 + timedelta(milliseconds=500))

    assert (await at(clock, gathering, T0 - LEAD_DELTA)).dispatched == 2
    assert [len(await executions(stores, j)) for j in (first, soon, later)] == [1, 1, 0]
    due_at = {m.due_at for m in consume(kafka_bootstrap, pool_topic(pool), 2)}
    assert due_at == {T0.isoformat(), (T0 + timedelta(milliseconds=150)).isoformat()}
    # The next look is still the publish lead before the next member, not the gather's more.
    assert gathering.next_look() == T0 + timedelta(milliseconds=500) - LEAD_DELTA
    gathering.sparse(False)  # a dense shard takes nothing ahead, gathered or not
    assert gathering.next_look() == T0 + timedelta(milliseconds=500)
