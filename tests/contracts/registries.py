"""The stores under contract, all of one implementation: the in-memory fakes, or the Postgres stores."""

from __future__ import annotations

from dataclasses import dataclass

from sundial_common.stores import Stores
from sundial_common.stores.keys import KeyStore
from sundial_common.stores.pools import PoolStore
from sundial_common.stores.tenants import TenantStore
from sundial_common.testing import InMemoryKeyStore, InMemoryPoolStore, InMemoryTenantStore


@dataclass(frozen=True, slots=True)
class Registries:
    """The tenant, pool and key stores of one implementation (a pool's owner is a tenant of the same one)."""

    tenants: TenantStore
    pools: PoolStore
    keys: KeyStore

    @classmethod
    def in_memory(cls) -> Registries:
        return cls(InMemoryTenantStore(), InMemoryPoolStore(), InMemoryKeyStore())

    @classmethod
    def postgres(cls, stores: Stores) -> Registries:
        return cls(stores.tenants, stores.pools, stores.keys)
