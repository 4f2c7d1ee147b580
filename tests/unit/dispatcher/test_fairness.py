"""The fair queue's round robin: shares by weight, a small tenant served at once, full pools and quotas."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

from sundial_common.stores.types import Occurrence
from sundial_common.testing import InMemoryTenantStore
from sundial_dispatcher.fairness import EarlyWork, FairDispatch, FairnessConfig, FairQueue, OpenWork, Waiting

DUE = datetime(2026, 1, 1, tzinfo=UTC)


def items(tenant: str, n: int, pool: str = "p", priority: str = "NORMAL", due: datetime = DUE) -> list[Waiting]:
    return [Waiting(Occurrence(uuid.uuid4(), due), tenant, pool, priority) for _ in range(n)]


def shares(taken: list[Waiting]) -> Counter[str]:
    return Counter(w.tenant for w in taken)


def test_a_small_tenant_behind_a_huge_burst_is_served_in_the_first_pass() -> None:
    queue = FairQueue()
    queue.add(items("a", 50_000))
    queue.add(items("b", 100))
    taken = queue.take(1000, {}, {}, {}, default_pool_room=10_000)
    assert shares(taken) == {"a": 900, "b": 100}


def test_saturated_tenants_share_by_weight_and_order_within_a_tenant_is_kept() -> None:
    queue = FairQueue()
    a, b = items("a", 5000), items("b", 5000)
    queue.add(a)
    queue.add(b)
    taken = [w for _ in range(5) for w in queue.take(300, {"a": 2, "b": 1}, {}, {}, default_pool_room=10_000)]
    assert shares(taken) == {"a": 1000, "b": 500}
    assert [w for w in taken if w.tenant == "a"] == a[:1000]


def test_a_full_pool_or_a_concurrency_quota_holds_work_back_without_blocking_others() -> None:
    queue = FairQueue()
    queue.add(items("a", 100, pool="busy"))
    queue.add(items("b", 100, pool="idle"))
    queue.add(items("c", 100, pool="idle"))
    pool_room = {"busy": 5}
    taken = queue.take(100, {}, pool_room, {"c": 10}, default_pool_room=1000)
    assert shares(taken) == {"a": 5, "b": 85, "c": 10}
    assert pool_room["busy"] == 0 and len(queue) == 200


def test_put_back_returns_items_to_the_front_in_order() -> None:
    queue = FairQueue()
    a = items("a", 3)
    queue.add(a)
    taken = queue.take(3, {}, {}, {}, default_pool_room=10)
    queue.put_back(taken[1:])
    assert queue.take(3, {}, {}, {}, default_pool_room=10) == a[1:]


def test_the_queue_knows_when_only_scheduled_retries_wait_in_it() -> None:
    queue = FairQueue()
    assert queue.only_retries()  # empty
    retries = [Waiting(Occurrence(uuid.uuid4(), DUE), "a", "p", retry=True) for _ in range(3)]
    queue.add(retries)
    assert queue.only_retries()
    queue.add(items("b", 1))
    assert not queue.only_retries()
    taken = queue.take(10, {}, {}, {}, default_pool_room=10)
    assert len(taken) == 4 and queue.only_retries()
    queue.put_back([w for w in taken if w.tenant == "b"])
    assert not queue.only_retries()
    queue.take(10, {}, {}, {}, default_pool_room=10)
    queue.put_back(retries[:2])
    assert queue.retries == 2 and queue.only_retries()


def test_a_job_claimed_again_while_it_waits_is_queued_once() -> None:
    queue = FairQueue()
    a = items("a", 2)
    queue.add(a)
    queue.add(a[:1])  # the hydrator's overdue scan re-added it, and it was claimed again
    assert len(queue) == 2
    assert queue.take(10, {}, {}, {}, default_pool_room=10) == a
    queue.add(a[:1])  # taken (dispatched): a later fire of the same job queues again
    assert len(queue) == 1


def test_a_burst_claimed_ahead_joins_the_queue_at_its_instant_as_if_queued_one_by_one() -> None:
    mixed = items("a", 30, due=DUE) + items("b", 5, pool="q", due=DUE) + items("a", 5, priority="HIGH", due=DUE)
    later = items("a", 10, due=DUE + timedelta(seconds=1))
    early = EarlyWork()
    early.push(later + mixed)
    assert len(early) == 50 and early.first_due() == DUE and not early.due(DUE - timedelta(milliseconds=1))
    by_arrival, one_by_one = FairQueue(), FairQueue()
    for arrival in early.pop_due(DUE):
        by_arrival.add_arrival(arrival)
    one_by_one.add(mixed)
    assert len(early) == 10 and early.first_due() == DUE + timedelta(seconds=1) and list(early) == later
    assert by_arrival.waiting == one_by_one.waiting
    taken = by_arrival.take(40, {"a": 2}, {}, {}, default_pool_room=100)
    assert taken == one_by_one.take(40, {"a": 2}, {}, {}, default_pool_room=100)
    assert len(by_arrival) == len(one_by_one) == 0


def test_an_arrival_whose_job_is_already_queued_queues_it_once() -> None:
    queue = FairQueue()
    a = items("a", 3)
    queue.add(a[:1])  # claimed again meanwhile (the hydrator's overdue scan re-added it)
    early = EarlyWork()
    early.push(a)
    for arrival in early.pop_due(DUE):
        queue.add_arrival(arrival)
    assert queue.take(10, {}, {}, {}, default_pool_room=10) == a


def test_within_a_tenant_high_goes_before_normal_before_low_and_each_lane_stays_in_due_order() -> None:
    queue = FairQueue()
    low = items("a", 30, priority="LOW", due=DUE - timedelta(seconds=60))  # the oldest backlog
    normal = items("a", 5)
    high = items("a", 5, priority="HIGH", due=DUE + timedelta(seconds=1))
    queue.add(low + normal + high)
    taken = queue.take(9, {}, {}, {}, default_pool_room=1000)
    # Nine takes: the ninth is still a priority pick (one in ten goes to the oldest whatever its priority).
    assert taken == high + normal[:4]


def test_low_work_keeps_a_tenth_of_the_tenants_dispatch_under_sustained_high_load() -> None:
    queue = FairQueue()
    low = items("a", 100, priority="LOW", due=DUE - timedelta(seconds=60))
    queue.add(low)
    taken: list[Waiting] = []
    for _ in range(20):  # a HIGH burst keeps arriving ahead of the LOW backlog
        queue.add(items("a", 50, priority="HIGH"))
        taken += queue.take(50, {}, {}, {}, default_pool_room=1000)
    got_low = [w for w in taken if w.priority == "LOW"]
    assert len(got_low) == len(taken) // 10 and got_low == low[: len(got_low)]  # oldest first


def test_priority_buys_a_tenant_nothing_against_another() -> None:
    queue = FairQueue()
    queue.add(items("all-high", 500, priority="HIGH") + items("all-low", 500, priority="LOW"))
    taken = [w for _ in range(4) for w in queue.take(100, {}, {}, {}, default_pool_room=10_000)]
    assert shares(taken) == {"all-high": 200, "all-low": 200}


def test_a_full_pool_is_reported_so_its_cap_can_grow() -> None:
    queue = FairQueue()
    queue.add(items("a", 10, pool="busy") + items("b", 10, pool="free"))
    queue.take(100, {}, {"busy": 3}, {}, default_pool_room=1000)
    assert queue.full_pools == {"busy"}


def test_high_work_may_fill_a_full_pools_queue_up_to_its_own_room_and_low_work_may_not() -> None:
    queue = FairQueue()
    queue.add(items("a", 10, priority="LOW") + items("a", 5, priority="HIGH"))
    pool_room, high_room = {"p": 0}, {"p": 3}
    taken = queue.take(100, {}, pool_room, {}, default_pool_room=1000, high_room=high_room)
    assert [w.priority for w in taken] == ["HIGH"] * 3 and high_room["p"] == 0
    assert queue.full_pools == {"p"}, "the LOW backlog is still held back by the cap"
    taken = queue.take(100, {}, {"p": 2}, {}, default_pool_room=1000, high_room={"p": 0})
    assert [w.priority for w in taken] == ["HIGH", "HIGH"], "within the cap HIGH still goes first"


def test_a_tenants_low_work_yields_the_pool_to_its_high_work_waiting_in_another_shards_queue() -> None:
    here, there = FairQueue(), FairQueue()
    here.add(items("a", 20, priority="LOW") + items("b", 20))
    there.add(items("a", 1, priority="HIGH"))
    taken = here.take(10, {}, {}, {}, default_pool_room=1000, elsewhere=there.best_lane)
    # a's LOW waits (its HIGH elsewhere goes first); b's work, of another tenant, is not held back by it.
    assert shares(taken) == {"b": 10}
    assert there.take(10, {}, {}, {}, default_pool_room=1000)[0].priority == "HIGH"
    assert len(here.take(10, {}, {}, {}, default_pool_room=1000, elsewhere=there.best_lane)) == 10


def test_a_shard_whose_term_ended_no_longer_holds_back_the_others() -> None:
    work = OpenWork(InMemoryTenantStore(), FairnessConfig())
    ended = FairDispatch(1, None, None, None, None, FairnessConfig(), 100, 2, work)  # type: ignore[arg-type]
    ended.queue.add(items("a", 1, priority="HIGH"))
    assert work.best_lane_elsewhere(0)("a", "p") == 0
    ended.forget()
    assert work.best_lane_elsewhere(0)("a", "p") == 3


def test_a_leader_looks_at_a_distant_member_once_a_burst_horizon_before_it_is_due() -> None:
    config = FairnessConfig(burst_ahead_sec=1.0)
    fair = FairDispatch(0, None, None, None, None, config, 100)  # type: ignore[arg-type]
    now = datetime(2026, 1, 1, tzinfo=UTC)
    fair._window_next = now + timedelta(seconds=15)
    assert fair.next_look(now) == now + timedelta(seconds=14), "a pass then claims a burst due with it ahead"
    fair._window_next = now + timedelta(milliseconds=900)
    assert fair.next_look(now) == now + timedelta(milliseconds=900), "within the horizon: at its instant"
    off = FairDispatch(0, None, None, None, None, FairnessConfig(burst_ahead_min=0), 100)  # type: ignore[arg-type]
    off._window_next = now + timedelta(seconds=15)
    assert off.next_look(now) == now + timedelta(seconds=15)
