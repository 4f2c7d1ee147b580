"""The breaker loop's passes over an in-memory breaker store: what an operator sees a handler's breaker do as its
attempts fail and then succeed, and a tenant's own settings, without Postgres."""

from __future__ import annotations

from datetime import UTC, datetime

from sundial_common.stores.breakers import CLOSED, HALF_OPEN, OPEN, BreakerSettings
from sundial_common.stores.tenants import Tenant
from sundial_common.testing import FakeClock, InMemoryBreakerStore, InMemoryTenantStore
from sundial_sweeper.breakers import BreakerLoop, BreakerLoopConfig, BreakerPassResult

S = BreakerSettings(min_attempts=20, failure_ratio=0.5, cooldown_sec=30, max_cooldown_sec=100, probes=10)
NOW = datetime(2026, 11, 24, 12, tzinfo=UTC)


async def loop_of(*tenants: Tenant) -> tuple[BreakerLoop, InMemoryBreakerStore, FakeClock]:
    clock = FakeClock(NOW)
    registry = InMemoryTenantStore(clock)
    for tenant in tenants or (Tenant("acme"),):
        await registry.create_tenant(tenant)
    store = InMemoryBreakerStore(registry, clock)
    return BreakerLoop(store, None, BreakerLoopConfig(defaults=S)), store, clock


def ended(store: InMemoryBreakerStore, clock: FakeClock, ok: int, failed: int, tenant: str = "acme") -> None:
    for i in range(ok + failed):
        store.count_attempt(tenant, "demo", "send", clock.now(), failed=i < failed)


async def test_a_failing_handler_is_opened_probed_after_its_cool_down_and_closed_when_the_probes_succeed() -> None:
    loop, store, clock = await loop_of()
    ended(store, clock, ok=0, failed=19)
    assert await loop.run_once() == BreakerPassResult(), "fewer attempts than it takes to judge"
    [closed] = await store.all_breakers()
    assert (closed.state, closed.attempts, closed.failures) == (CLOSED, 19, 19)

    clock.advance(1)
    ended(store, clock, ok=10, failed=6)
    assert await loop.run_once() == BreakerPassResult(opened=1)
    [opened] = await store.all_breakers()
    assert (opened.state, opened.opens, opened.attempts, opened.failures) == (OPEN, 1, 35, 25)

    clock.advance(29)
    assert await loop.run_once() == BreakerPassResult(), "still cooling down"
    clock.advance(2)
    assert await loop.run_once() == BreakerPassResult(half_opened=1)
    [half] = await store.all_breakers()
    assert (half.state, half.probe_limit) == (HALF_OPEN, 10)

    clock.advance(1)
    ended(store, clock, ok=10, failed=0)
    assert await loop.run_once() == BreakerPassResult(closed=1)
    [again] = await store.all_breakers()
    assert (again.state, again.opened_at, again.opens) == (CLOSED, None, 1)

    clock.advance(S.window_sec + 1)
    assert await loop.run_once() == BreakerPassResult()
    [quiet] = await store.all_breakers()
    assert (quiet.state, quiet.attempts, quiet.failures) == (CLOSED, 0, 0), "what ended before the window is not"


async def test_a_tenant_judges_its_handlers_by_its_own_settings() -> None:
    strict = Tenant("globex", breaker={"minAttempts": 5, "failureRatio": 0.2})
    loop, store, clock = await loop_of(Tenant("acme"), strict)
    ended(store, clock, ok=4, failed=2, tenant="acme")
    ended(store, clock, ok=4, failed=2, tenant="globex")
    assert await loop.run_once() == BreakerPassResult(opened=1)
    assert {b.tenant_id: b.state for b in await store.all_breakers()} == {"acme": CLOSED, "globex": OPEN}


async def test_an_unregistered_tenants_attempts_make_no_breaker() -> None:
    loop, store, clock = await loop_of()
    ended(store, clock, ok=0, failed=30, tenant="initech")
    assert await loop.run_once() == BreakerPassResult()
    assert await store.all_breakers() == []
