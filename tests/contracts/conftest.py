"""``registries``: the tenant, pool and key stores of one implementation, once per implementation.

The in-memory ones need nothing; the Postgres ones take the ``stores`` fixture (a fresh database of this test's
own), asked for only when that parameter runs, so the in-memory half of the suite starts no server.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from sundial_common.stores import Stores
from sundial_common.stores.keys import KeyStore
from sundial_common.stores.pools import PoolStore
from sundial_common.stores.tenants import TenantStore
from sundial_common.testing import InMemoryKeyStore, InMemoryPoolStore, InMemoryTenantStore


@dataclass(frozen=True, slots=True)
class Registries:
    """The stores under contract, all of one implementation (a pool's owner is a tenant of the same one)."""

    tenants: TenantStore
    pools: PoolStore
    keys: KeyStore


@pytest.fixture(params=["in-memory", "postgres"])
def registries(request: pytest.FixtureRequest) -> Registries:
    if request.param == "postgres":
        stores: Stores = request.getfixturevalue("stores")
        return Registries(stores.tenants, stores.pools, stores.keys)
    return Registries(InMemoryTenantStore(), InMemoryPoolStore(), InMemoryKeyStore())
