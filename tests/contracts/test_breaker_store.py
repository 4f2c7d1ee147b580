"""The breaker store's contract: one CLOSED breaker per handler of a registered tenant, listed in a fixed order and
only to its tenant; the window's counts per handler and second, pruned by age; compare-and-set transitions on
``version`` that start and end a state as the breaker loop relies on; and when the store is quiet."""

from __future__ import annotations

from datetime import timedelta

from sundial_common.stores.breakers import CLOSED, HALF_OPEN, OPEN, Transition
from sundial_common.stores.tenants import Tenant

from tests.contracts.breakers import Breakers


async def registered(breakers: Breakers, *names: str) -> None:
    for name in names:
        assert await breakers.tenants.create_tenant(Tenant(name)) is not None


async def test_each_handler_of_a_registered_tenant_gets_one_closed_breaker(breakers: Breakers) -> None:
    await registered(breakers, "acme", "globex")
    store = breakers.store
    since = await store.now() - timedelta(seconds=60)
    await store.ensure_breakers([("globex", "demo", "send"), ("acme", "mail", "send"), ("acme", "demo", "b")], since)
    await store.ensure_breakers([("acme", "demo", "b"), ("initech", "demo", "send")], since)  # known; unregistered

    listed = await store.all_breakers()
    assert [(b.tenant_id, b.pool, b.handler) for b in listed] == [
        ("acme", "demo", "b"),
        ("acme", "mail", "send"),
        ("globex", "demo", "send"),
    ]
    first = listed[0]
    assert (first.state, first.version, first.opens, first.held, first.probe_due) == (CLOSED, 1, 0, 0, False)
    assert (first.attempts, first.failures, first.opened_at, first.next_probe_at) == (0, 0, None, None)
    assert abs(first.since - since) < timedelta(milliseconds=1)

    assert [b.handler for b in await store.tenant_breakers("acme", None, None)] == ["b", "send"]
    assert [b.pool for b in await store.tenant_breakers("acme", "mail", None)] == ["mail"]
    assert await store.tenant_breakers("acme", None, OPEN) == []
    assert await store.get_breaker("acme", first.id) == first
    assert await store.get_breaker("globex", first.id) is None, "another tenant's breaker is not found"


async def test_the_window_counts_each_handlers_attempts_per_second_and_forgets_old_seconds(breakers: Breakers) -> None:
    await registered(breakers, "acme")
    store = breakers.store
    now = (await store.now()).replace(microsecond=500_000)
    for failed in (True, True, False):
        await breakers.count("acme", "demo", "send", now, failed)
    await breakers.count("acme", "demo", "send", now - timedelta(seconds=90), True)
    await breakers.count("acme", "demo", "other", now, False)

    buckets = {
        (b.handler, b.bucket): (b.attempts, b.failures) for b in await store.window_counts(now - timedelta(seconds=60))
    }
    second = now.replace(microsecond=0)
    assert buckets == {("send", second): (3, 2), ("other", second): (1, 0)}
    assert len(await store.window_counts(now - timedelta(seconds=120))) == 3

    assert await store.prune_counts(now - timedelta(seconds=60)) == 1
    assert len(await store.window_counts(now - timedelta(seconds=120))) == 2


async def test_a_transition_is_a_compare_and_set_that_starts_the_new_state(breakers: Breakers) -> None:
    await registered(breakers, "acme")
    store = breakers.store
    since = await store.now()
    await store.ensure_breakers([("acme", "demo", "send")], since)
    [closed] = await store.all_breakers()

    await store.record_window([(closed.id, 30, 20)])
    [counted] = await store.all_breakers()
    assert (counted.attempts, counted.failures, counted.version) == (30, 20, 1), "a window is no state change"

    move = Transition(
        counted, OPEN, "opened", "sweeper", next_probe_in_sec=30, cooldown_sec=30, attempts=30, failures=20
    )
    opened = await store.transition(move)
    assert opened is not None
    assert (opened.state, opened.version, opened.opens, opened.attempts, opened.failures) == (OPEN, 2, 1, 30, 20)
    assert opened.opened_at is not None and opened.next_probe_at is not None
    assert timedelta(seconds=29) < opened.next_probe_at - opened.opened_at <= timedelta(seconds=31)
    assert opened.since == counted.since, "an open breaker keeps counting from where it was"
    assert not opened.probe_due
    assert await store.transition(move) is None, "a move from a version that is gone changes nothing"
    assert (await store.get_breaker("acme", closed.id)) == opened

    half = await store.transition(
        Transition(opened, HALF_OPEN, "half_opened", "sweeper", next_probe_in_sec=0, cooldown_sec=30, probe_limit=5)
    )
    assert half is not None and (half.state, half.probe_limit, half.probes_sent, half.version) == (HALF_OPEN, 5, 0, 3)
    assert half.opened_at == opened.opened_at
    [read] = await store.all_breakers()
    assert read.probe_due, "its next probe time has come"

    again = await store.now()
    shut = await store.transition(
        Transition(half, CLOSED, "closed", "operator", manual=True, since=again, since_attempts=2, since_failures=1)
    )
    assert shut is not None
    assert (shut.state, shut.opened_at, shut.next_probe_at, shut.manual, shut.opens) == (CLOSED, None, None, True, 1)
    assert (shut.since_attempts, shut.since_failures) == (2, 1)
    assert abs(shut.since - again) < timedelta(milliseconds=1)


async def test_the_store_is_quiet_only_with_nothing_counted_and_every_breaker_closed_and_empty(
    breakers: Breakers,
) -> None:
    await registered(breakers, "acme")
    store = breakers.store
    assert await store.quiet()
    now = await store.now()
    await breakers.count("acme", "demo", "send", now, False)
    assert not await store.quiet()
    await store.ensure_breakers([("acme", "demo", "send")], now)
    await store.prune_counts(now + timedelta(seconds=1))
    assert await store.quiet()
    [breaker] = await store.all_breakers()
    await store.record_window([(breaker.id, 1, 0)])
    assert not await store.quiet()


async def test_tenant_settings_are_those_tenants_set_for_themselves(breakers: Breakers) -> None:
    await registered(breakers, "acme")
    assert await breakers.tenants.create_tenant(Tenant("globex", breaker={"failureRatio": 0.8})) is not None
    assert await breakers.store.tenant_settings() == {"globex": {"failureRatio": 0.8}}
