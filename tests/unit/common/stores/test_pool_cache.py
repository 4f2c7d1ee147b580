"""The pool registry cache (``sundial_common.stores.pool_cache``) over the in-memory registry: a change made
through another replica applies within the entry's lifetime, a recheck reads at most once per interval, callers
that find an entry expired together share one read, and a failed read keeps the last answer."""

from __future__ import annotations

import asyncio

import pytest
from sundial_common.stores.pool_cache import PoolCache
from sundial_common.stores.pools import Pool
from sundial_common.testing import FakeClock, InMemoryPoolStore


class CountingPools(InMemoryPoolStore):
    """The in-memory registry, counting reads; ``failing`` makes them raise as an unreachable Postgres does."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.failing = False

    async def get_pool(self, name: str) -> Pool | None:
        self.reads += 1
        if self.failing:
            raise OSError("connection refused")
        await asyncio.sleep(0)  # a real read yields: callers arriving meanwhile find it in flight
        return await super().get_pool(name)


async def test_a_pool_registered_elsewhere_is_seen_once_the_not_registered_answer_has_expired() -> None:
    store, clock = CountingPools(), FakeClock()
    cache = PoolCache(store, ttl_sec=2.0, clock=clock.monotonic, recheck_sec=0.25)
    assert await cache.get("email") is None
    await store.create_pool(Pool("email", owner="acme"))  # through another API replica
    clock.advance(1.9)
    assert await cache.get("email") is None, "the answer is kept its lifetime"
    clock.advance(0.1)
    cached = await cache.get("email")
    assert cached is not None and cached.admits("acme")
    assert store.reads == 2


async def test_a_recheck_reads_the_registry_at_most_once_per_interval() -> None:
    store, clock = CountingPools(), FakeClock()
    cache = PoolCache(store, ttl_sec=60.0, clock=clock.monotonic, recheck_sec=0.25)
    assert await cache.get("email") is None
    await store.create_pool(Pool("email", owner="acme"))
    assert await cache.recheck("email") is not None, "a refusal first reads again: the pool is there now"
    await store.delete_pool("email")
    for _ in range(10):  # a stream of refused requests
        assert await cache.recheck("email") is not None
    assert store.reads == 2
    clock.advance(0.25)
    assert await cache.recheck("email") is None
    assert store.reads == 3


async def test_callers_that_find_an_entry_expired_together_share_one_read() -> None:
    store, clock = CountingPools(), FakeClock()
    await store.create_pool(Pool("email", owner="acme"))
    cache = PoolCache(store, ttl_sec=2.0, clock=clock.monotonic)
    answers = await asyncio.gather(*(cache.get("email") for _ in range(20)))
    assert all(a is not None and a.name == "email" for a in answers)
    assert store.reads == 1


async def test_a_failed_read_keeps_the_last_answer_and_a_pool_never_read_fails() -> None:
    store, clock = CountingPools(), FakeClock()
    await store.create_pool(Pool("email", owner="acme"))
    cache = PoolCache(store, ttl_sec=2.0, clock=clock.monotonic)
    assert await cache.get("email") is not None
    store.failing = True
    clock.advance(5)
    kept = await cache.get("email")
    assert kept is not None and kept.name == "email", "a Postgres outage does not stop a worker that knew its pool"
    with pytest.raises(OSError):
        await cache.get("sms")


async def test_a_change_made_through_this_replica_applies_at_once() -> None:
    store, clock = CountingPools(), FakeClock()
    cache = PoolCache(store, ttl_sec=60.0, clock=clock.monotonic)
    assert await cache.get("email") is None
    created = await store.create_pool(Pool("email", owner="acme"))
    assert created is not None
    cache.put(created)
    assert await cache.get("email") == created
    cache.forget("email")
    assert await cache.get("email") == created
    assert store.reads == 2
