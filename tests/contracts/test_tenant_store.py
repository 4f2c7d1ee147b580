"""The tenant registry's contract: creates that never overwrite, keyset pages in id order, compare-and-set
updates on ``version``, and the job and execution counts of a tenant that has none."""

from __future__ import annotations

import uuid

from sundial_common.stores.tenants import SUSPENDED, Quotas, Tenant

from tests.contracts.registries import Registries


async def test_a_tenant_is_created_once_at_version_1_and_read_back_as_written(registries: Registries) -> None:
    tenants = registries.tenants
    tenant = Tenant("acme", display_name="Acme", weight=3, quotas=Quotas(max_active_jobs=10), default_jitter_sec=5)
    created = await tenants.create_tenant(tenant)
    assert created is not None
    assert (created.id, created.display_name, created.weight, created.quotas) == ("acme", "Acme", 3, tenant.quotas)
    assert (created.default_jitter_sec, created.state, created.version) == (5, "ACTIVE", 1)
    assert created.created_at is not None and created.updated_at is not None
    assert await tenants.get_tenant("acme") == created

    assert await tenants.create_tenant(Tenant("acme", display_name="Other")) is None, "an id is never reused"
    assert await tenants.get_tenant("acme") == created, "and the first one is left as it was"
    assert await tenants.get_tenant("globex") is None


async def test_tenants_are_listed_in_id_order_in_keyset_pages(registries: Registries) -> None:
    for name in ("c", "a", "d", "b"):
        await registries.tenants.create_tenant(Tenant(name))
    assert [t.id for t in await registries.tenants.all_tenants()] == ["a", "b", "c", "d"]
    assert [t.id for t in await registries.tenants.list_tenants(None, 3)] == ["a", "b", "c"]
    assert [t.id for t in await registries.tenants.list_tenants("b", 3)] == ["c", "d"]
    assert await registries.tenants.list_tenants("d", 3) == []


async def test_an_update_writes_every_field_and_moves_the_version_only_from_the_expected_one(
    registries: Registries,
) -> None:
    tenants = registries.tenants
    created = await tenants.create_tenant(Tenant("acme"))
    assert created is not None
    changed = Tenant(
        "acme",
        display_name="Acme Corp",
        weight=7,
        quotas=Quotas(max_creates_per_sec=2.5, max_concurrent_executions=4, max_dispatch_per_sec=100.0),
        default_jitter_sec=30,
        state=SUSPENDED,
        breaker={"failureRatio": 0.5},
    )
    assert await tenants.update_tenant(changed, expected_version=2) is None, "not at version 2"
    assert await tenants.get_tenant("acme") == created

    updated = await tenants.update_tenant(changed, expected_version=1)
    assert updated is not None
    assert (updated.display_name, updated.weight, updated.quotas) == ("Acme Corp", 7, changed.quotas)
    assert (updated.default_jitter_sec, updated.state, updated.breaker) == (30, SUSPENDED, {"failureRatio": 0.5})
    assert not updated.active
    assert updated.version == 2 and updated.created_at == created.created_at
    assert updated.updated_at is not None and created.updated_at is not None
    assert updated.updated_at >= created.updated_at
    assert await tenants.get_tenant("acme") == updated

    again = await tenants.update_tenant(Tenant("acme", weight=2))
    assert again is not None and (again.version, again.weight, again.breaker) == (3, 2, None), "no version: any"
    assert await tenants.update_tenant(Tenant("globex")) is None, "an unknown tenant is not created"
    assert await tenants.get_tenant("globex") is None


async def test_the_stored_breaker_settings_are_the_stores_own_copy(registries: Registries) -> None:
    settings = {"failureRatio": 0.5, "minAttempts": 20}
    await registries.tenants.create_tenant(Tenant("acme", breaker=settings))
    settings["failureRatio"] = 0.9
    stored = await registries.tenants.get_tenant("acme")
    assert stored is not None and stored.breaker == {"failureRatio": 0.5, "minAttempts": 20}
    assert isinstance(stored.breaker, dict)
    stored.breaker["minAttempts"] = 1  # what a read hands out is the reader's own
    again = await registries.tenants.get_tenant("acme")
    assert again is not None and again.breaker == {"failureRatio": 0.5, "minAttempts": 20}


async def test_a_tenant_without_jobs_or_executions_counts_none(registries: Registries) -> None:
    await registries.tenants.create_tenant(Tenant("acme", quotas=Quotas(max_active_jobs=1)))
    assert await registries.tenants.count_open_jobs("acme") == 0
    assert await registries.tenants.job_owners([uuid.uuid4(), uuid.uuid4()]) == {}
    assert await registries.tenants.retry_owners([uuid.uuid4()]) == {}
    assert await registries.tenants.open_executions(queued_within_sec=30.0) == []
