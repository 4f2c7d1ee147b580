"""``registries``: the tenant, pool and key stores of one implementation, once per implementation; ``breakers``:
the breaker store (with its tenants) likewise.

The in-memory ones need nothing; the Postgres ones take the ``stores`` fixture (a fresh database of this test's
own), asked for only when that parameter runs, so the in-memory half of the suite starts no server.
"""

from __future__ import annotations

import pytest
from sundial_common.stores import Stores

from tests.contracts.breakers import Breakers
from tests.contracts.registries import Registries


@pytest.fixture(params=["in-memory", "postgres"])
def registries(request: pytest.FixtureRequest) -> Registries:
    if request.param == "postgres":
        stores: Stores = request.getfixturevalue("stores")
        return Registries.postgres(stores)
    return Registries.in_memory()


@pytest.fixture(params=["in-memory", "postgres"])
def breakers(request: pytest.FixtureRequest) -> Breakers:
    if request.param == "postgres":
        stores: Stores = request.getfixturevalue("stores")
        return Breakers.postgres(stores)
    return Breakers.in_memory()
