"""``registries``: the tenant, pool and key stores of one implementation, once per implementation; ``breakers``
(the breaker store with its tenants) and ``jobs`` (the job and idempotency stores) likewise.

The in-memory ones need nothing; the Postgres ones take the ``stores`` fixture (a fresh database of this test's
own), asked for only when that parameter runs, so the in-memory half of the suite starts no server.
"""

from __future__ import annotations

from typing import cast

import pytest
from sundial_common.stores import Stores

from tests.contracts.breakers import Breakers
from tests.contracts.jobs import Jobs
from tests.contracts.registries import Registries


def _postgres(request: pytest.FixtureRequest) -> Stores | None:
    """This test's Postgres stores when the implementation under contract is Postgres' (only then is a database
    made), else None."""
    return cast(Stores, request.getfixturevalue("stores")) if request.param == "postgres" else None


@pytest.fixture(params=["in-memory", "postgres"])
def registries(request: pytest.FixtureRequest) -> Registries:
    stores = _postgres(request)
    return Registries.in_memory() if stores is None else Registries.postgres(stores)


@pytest.fixture(params=["in-memory", "postgres"])
def breakers(request: pytest.FixtureRequest) -> Breakers:
    stores = _postgres(request)
    return Breakers.in_memory() if stores is None else Breakers.postgres(stores)


@pytest.fixture(params=["in-memory", "postgres"])
def jobs(request: pytest.FixtureRequest) -> Jobs:
    stores = _postgres(request)
    return Jobs.in_memory() if stores is None else Jobs.postgres(stores)
