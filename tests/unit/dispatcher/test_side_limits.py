"""Fair dispatch's limits as children and backfills meet them (``sundial_dispatcher.limits``): the room a pass has per
tenant and pool, the tenants and pools it leaves out of its scan, and the dispatch-rate tokens of what it planned."""

from __future__ import annotations

from typing import cast

from sundial_common.hotwindow.rate_limits import Grant, TokenBuckets
from sundial_common.stores.tenants import OpenExecutions, Quotas, Tenant
from sundial_common.testing import FakeClock, InMemoryTenantStore
from sundial_dispatcher.fairness import FairnessConfig, OpenWork
from sundial_dispatcher.limits import SideLimits
from sundial_dispatcher.tenancy import TenantPolicy


class Registry(InMemoryTenantStore):
    """The in-memory tenant registry, with the census of open executions a fair pass reads (the in-memory store
    holds no executions, so the test says what Postgres would count)."""

    def __init__(self, rows: list[OpenExecutions]) -> None:
        super().__init__()
        self.rows = rows

    async def open_executions(
        self, queued_within_sec: float, fresh_within_sec: float | None = None
    ) -> list[OpenExecutions]:
        return self.rows


async def registry(tenants: list[Tenant], rows: list[OpenExecutions]) -> Registry:
    store = Registry(rows)
    for tenant in tenants:
        assert await store.create_tenant(tenant) is not None
    return store


class Buckets:
    """Token buckets holding ``tokens`` each, refilled by nobody; the next token in 250 ms."""

    def __init__(self, tokens: int) -> None:
        self.tokens: dict[str, int] = {}
        self.start = tokens

    async def take(self, name: str, rate: float, want: int = 1, burst: float | None = None) -> Grant:
        have = self.tokens.setdefault(name, self.start)
        granted = min(have, want)
        self.tokens[name] = have - granted
        return Grant(granted, 0 if granted == want else 250)


def limits(store: Registry, buckets: Buckets, clock: FakeClock) -> SideLimits:
    config = FairnessConfig(pool_queue_cap=10, pool_queue_min=10, counts_refresh_sec=0)
    return SideLimits(
        TenantPolicy(store, refresh_sec=0),
        OpenWork(store, config),
        cast(TokenBuckets, buckets),
        shards=1,
        batch_size=100,
        clock=clock.monotonic,
    )


async def test_the_room_is_the_least_of_the_pools_queue_and_the_tenants_quota_and_is_used_up_as_planned() -> None:
    store = await registry(
        [Tenant("capped", quotas=Quotas(max_concurrent_executions=3)), Tenant("free")],
        [
            OpenExecutions("capped", "p", queued=1, pending=1, running=0, open=2),
            OpenExecutions("free", "full", queued=10, pending=10, running=1, open=11),
        ],
    )
    room = await limits(store, Buckets(100), FakeClock()).room()
    assert room.available("capped", "p") == 1  # 3 - 2 open
    assert room.available("free", "p") == 9  # the pool's 10 - 1 queued
    assert room.available("free", "full") == 0 and room.full_pools == {"full"}
    room.use("capped", "p", 1)
    assert room.available("capped", "p") == 0 and room.available("free", "p") == 8
    assert room.blocked_tenants() == ["capped"] and room.blocked_pools() == ["full"]


async def test_a_tenants_first_executions_get_its_rate_tokens_and_it_is_left_out_until_the_next_one() -> None:
    store = await registry([Tenant("rated", quotas=Quotas(max_dispatch_per_sec=2)), Tenant("free")], [])
    clock = FakeClock()
    side = limits(store, Buckets(2), clock)
    kept = await side.within_rate(await side.room(), ["rated", "free", "rated", "rated", "free"])
    assert kept == [True, True, True, False, True]
    assert (await side.room()).blocked_tenants() == ["rated"], "its bucket is empty: not scanned"
    clock.advance(0.3)
    assert (await side.room()).blocked_tenants() == [], "its next token is due: scanned again"
