"""The registry as a dispatcher process reads it (``sundial_dispatcher.tenancy.TenantPolicy``), over the in-memory
tenant store: a suspension or a new weight made through the API applies within ``refresh_sec``, not before."""

from __future__ import annotations

import dataclasses

from sundial_common.stores.tenants import SUSPENDED, Tenant
from sundial_common.testing import FakeClock, InMemoryTenantStore
from sundial_dispatcher.tenancy import TenantPolicy


async def test_a_suspension_applies_to_dispatch_once_the_registry_is_read_again() -> None:
    store, clock = InMemoryTenantStore(), FakeClock()
    acme = await store.create_tenant(Tenant("acme", weight=2))
    await store.create_tenant(Tenant("globex"))
    assert acme is not None
    policy = TenantPolicy(store, refresh_sec=2.0, clock=clock.monotonic)
    assert await policy.suspended() == frozenset()
    assert (await policy.tenants())["acme"].weight == 2

    await store.update_tenant(dataclasses.replace(acme, state=SUSPENDED, weight=5))  # through the API
    clock.advance(1.9)
    assert await policy.suspended() == frozenset(), "read at most every refresh_sec"
    clock.advance(0.1)
    assert await policy.suspended() == frozenset({"acme"})
    assert (await policy.tenants())["acme"].weight == 5
    assert set(await policy.tenants()) == {"acme", "globex"}
