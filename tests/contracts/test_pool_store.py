"""The pool registry's contract: creates that never overwrite, who a pool admits, keyset pages (all pools, or
a tenant's), compare-and-set updates that leave the topic's settings alone, and deletes."""

from __future__ import annotations

from sundial_common.stores.pools import STAGING, Deleted, Pool, Updated
from sundial_common.stores.tenants import Tenant

from tests.contracts.registries import Registries


async def tenants(registries: Registries, *names: str) -> None:
    """Register ``names``: a pool's owner and the tenants it is shared with must exist."""
    for name in names:
        assert await registries.tenants.create_tenant(Tenant(name)) is not None


async def test_a_pool_is_created_once_at_version_1_and_admits_its_owner_only(registries: Registries) -> None:
    await tenants(registries, "acme", "globex")
    pool = Pool("email", owner="acme", partitions=6, retention_ms=86_400_000, default_timeout_sec=30)
    created = await registries.pools.create_pool(pool)
    assert created is not None
    assert (created.name, created.owner, created.shared_with, created.kind) == ("email", "acme", (), "production")
    assert (created.partitions, created.retention_ms, created.default_timeout_sec) == (6, 86_400_000, 30)
    assert created.version == 1 and created.created_at is not None
    assert created.admits("acme") and not created.admits("globex") and not created.staging
    assert await registries.pools.get_pool("email") == created

    assert await registries.pools.create_pool(Pool("email", owner="globex")) is None, "a name is never reused"
    assert await registries.pools.get_pool("email") == created
    assert await registries.pools.get_pool("sms") is None


async def test_a_shared_pool_admits_the_tenants_it_is_shared_with(registries: Registries) -> None:
    await tenants(registries, "acme", "globex", "initech")
    policy = {"maxAttempts": 3, "backoff": "FIXED"}
    created = await registries.pools.create_pool(
        Pool("shared", shared_with=("acme", "globex"), default_retry_policy=policy)
    )
    assert created is not None and created.owner is None and created.shared_with == ("acme", "globex")
    assert created.admits("acme") and created.admits("globex") and not created.admits("initech")
    policy["maxAttempts"] = 9
    stored = await registries.pools.get_pool("shared")
    assert stored is not None and stored.default_retry_policy == {"maxAttempts": 3, "backoff": "FIXED"}
    stored.default_retry_policy["backoff"] = "EXPONENTIAL"  # what a read hands out is the reader's own
    again = await registries.pools.get_pool("shared")
    assert again is not None and again.default_retry_policy == {"maxAttempts": 3, "backoff": "FIXED"}


async def test_pools_are_listed_in_name_order_and_for_a_tenant_only_those_it_may_use(registries: Registries) -> None:
    await tenants(registries, "acme", "globex")
    for pool in (
        Pool("d", owner="globex"),
        Pool("b", owner="acme"),
        Pool("a", shared_with=("acme", "globex")),
        Pool("c", shared_with=("globex",)),
    ):
        await registries.pools.create_pool(pool)
    assert [p.name for p in await registries.pools.list_pools(None, 10)] == ["a", "b", "c", "d"]
    assert [p.name for p in await registries.pools.list_pools("a", 2)] == ["b", "c"]
    assert [p.name for p in await registries.pools.list_pools(None, 10, tenant="acme")] == ["a", "b"]
    assert [p.name for p in await registries.pools.list_pools("a", 1, tenant="globex")] == ["c"]
    assert await registries.pools.list_pools(None, 10, tenant="initech") == []


async def test_an_update_moves_the_version_only_from_the_expected_one_and_keeps_the_topic_settings(
    registries: Registries,
) -> None:
    await tenants(registries, "acme", "globex")
    created = await registries.pools.create_pool(Pool("email", owner="acme", partitions=6, retention_ms=60_000))
    assert created is not None
    changed = Pool(
        "email",
        shared_with=("acme", "globex"),
        kind=STAGING,
        partitions=12,
        retention_ms=120_000,
        default_timeout_sec=60,
        default_retry_policy={"maxAttempts": 2},
    )
    assert await registries.pools.update_pool(changed, expected_version=2) == Updated(None, 0)
    assert await registries.pools.get_pool("email") == created

    result = await registries.pools.update_pool(changed, expected_version=1)
    updated = result.pool
    assert updated is not None and result.active_jobs == 0, "no job targets it: it may turn staging"
    assert (updated.owner, updated.shared_with, updated.staging) == (None, ("acme", "globex"), True)
    assert (updated.default_timeout_sec, updated.default_retry_policy) == (60, {"maxAttempts": 2})
    assert (updated.partitions, updated.retention_ms) == (6, 60_000), "the topic's settings are fixed at creation"
    assert updated.version == 2 and updated.created_at == created.created_at
    assert await registries.pools.get_pool("email") == updated

    assert await registries.pools.update_pool(Pool("sms", owner="acme")) == Updated(None, 0)
    assert await registries.pools.get_pool("sms") is None, "an unknown pool is not created"


async def test_a_pool_without_jobs_is_deleted(registries: Registries) -> None:
    await tenants(registries, "acme")
    await registries.pools.create_pool(Pool("email", owner="acme"))
    assert await registries.pools.delete_pool("email") == Deleted(found=True, deleted=True, active_jobs=0)
    assert await registries.pools.get_pool("email") is None
    assert await registries.pools.delete_pool("email") == Deleted(found=False, deleted=False, active_jobs=0)
