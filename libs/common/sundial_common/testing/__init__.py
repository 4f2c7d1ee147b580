"""Fakes for tests of the logic above the stores — Sundial's own unit tests and its users' alike.

- :class:`~sundial_common.testing.clock.FakeClock` — the one test clock: wall and monotonic time that move only
  when the test moves them, and sleepers that wake when their time comes;
- :class:`~sundial_common.testing.breakers.InMemoryBreakerStore` — the retry circuit breakers and their window
  counts, which the sweeper's breaker loop judges and moves (a test counts the attempts that end);
- :class:`~sundial_common.testing.jobs.InMemoryJobStore` and
  :class:`~sundial_common.testing.idempotency.InMemoryIdempotencyStore` — jobs as the API creates, changes and lists
  them and the hydrator finds them due, and the Idempotency-Key claims that answer a retried create;
- :class:`~sundial_common.testing.tenants.InMemoryTenantStore`,
  :class:`~sundial_common.testing.pools.InMemoryPoolStore` and :class:`~sundial_common.testing.keys.InMemoryKeyStore`
  — the registries the API, the dispatcher's fair pass and the keyring read, held in a dict.

The in-memory stores pass the same contract suite as their Postgres twins (``tests/contracts``). The registries
and the breaker store hold no jobs, and none holds executions or the dependency graph: what counts those answers
as a database without any would. The compare-and-swap paths of
dispatch and start, fences and single success stay tested on real Postgres only.

Production code never imports this package (an import contract checks it).
"""

from __future__ import annotations

from sundial_common.testing.breakers import InMemoryBreakerStore
from sundial_common.testing.clock import FakeClock
from sundial_common.testing.idempotency import InMemoryIdempotencyStore
from sundial_common.testing.jobs import InMemoryJobStore
from sundial_common.testing.keys import InMemoryKeyStore
from sundial_common.testing.pools import InMemoryPoolStore
from sundial_common.testing.tenants import InMemoryTenantStore

__all__ = [
    "FakeClock",
    "InMemoryBreakerStore",
    "InMemoryIdempotencyStore",
    "InMemoryJobStore",
    "InMemoryKeyStore",
    "InMemoryPoolStore",
    "InMemoryTenantStore",
]
