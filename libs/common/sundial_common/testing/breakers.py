"""InMemoryBreakerStore: the retry circuit breakers and their window counts in dicts, for tests of the logic that
judges and moves breakers (the sweeper's breaker loop, the API's breaker views)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from sundial_common.runtime.clock import Clock, SystemClock
from sundial_common.stores.breakers import CLOSED, OPEN, Breaker, Released, Transition, WindowBucket
from sundial_common.testing.tenants import InMemoryTenantStore

#: The longest window a tenant may set: ``quiet`` looks that far back for an attempt that ended.
_LONGEST_WINDOW = timedelta(seconds=3600)


class InMemoryBreakerStore:
    """:class:`~sundial_common.stores.breakers.BreakerStore` over dicts, on ``clock``'s time where Postgres uses
    its ``now()``.

    Postgres counts the finished attempts of executions by a trigger; here a test counts them with
    :meth:`count_attempt`. It holds no executions and no jobs: no breaker holds a retry (``held`` is 0) and a
    release finds nothing to let go. Transitions are the same compare-and-sets, without the audit row.
    ``tenants``: whose breaker settings :meth:`tenant_settings` reads, and who may have breakers (as the
    ``tenants`` table is for Postgres); without it, every tenant is registered with the default settings.
    """

    def __init__(self, tenants: InMemoryTenantStore | None = None, clock: Clock | None = None) -> None:
        self._tenants = tenants
        self._clock = clock or SystemClock()
        self._breakers: dict[UUID, Breaker] = {}
        #: (tenant, pool, handler, second) → [attempts, failures]
        self._counts: dict[tuple[str, str, str, datetime], list[int]] = {}

    def count_attempt(self, tenant_id: str, pool: str, handler: str, at: datetime, *, failed: bool) -> None:
        """An attempt of the handler ended at ``at`` (what the executions trigger records in Postgres)."""
        bucket = self._counts.setdefault((tenant_id, pool, handler, at.replace(microsecond=0)), [0, 0])
        bucket[0] += 1
        bucket[1] += int(failed)

    async def now(self) -> datetime:
        return self._clock.now()

    async def quiet(self) -> bool:
        """Nothing ended within any window and every breaker is CLOSED with empty counts."""
        recent = self._clock.now() - _LONGEST_WINDOW
        return not any(key[3] >= recent for key in self._counts) and all(
            b.state == CLOSED and b.attempts == 0 and b.failures == 0 for b in self._breakers.values()
        )

    async def window_counts(self, since: datetime) -> list[WindowBucket]:
        return [
            WindowBucket(tenant, pool, handler, bucket, counts[0], counts[1])
            for (tenant, pool, handler, bucket), counts in self._counts.items()
            if bucket >= since
        ]

    async def prune_counts(self, before: datetime) -> int:
        old = [key for key in self._counts if key[3] < before]
        for key in old:
            del self._counts[key]
        return len(old)

    async def tenant_settings(self) -> dict[str, Mapping[str, Any]]:
        if self._tenants is None:
            return {}
        return {t.id: dict(t.breaker) for t in await self._tenants.all_tenants() if t.breaker is not None}

    async def all_breakers(self) -> list[Breaker]:
        found = sorted(self._breakers.values(), key=lambda b: (b.tenant_id, b.pool, b.handler))
        return [self._read(b) for b in found]

    async def tenant_breakers(self, tenant_id: str, pool: str | None, state: str | None) -> list[Breaker]:
        return [
            b
            for b in await self.all_breakers()
            if b.tenant_id == tenant_id and (pool is None or b.pool == pool) and (state is None or b.state == state)
        ]

    async def get_breaker(self, tenant_id: str, breaker_id: UUID) -> Breaker | None:
        breaker = self._breakers.get(breaker_id)
        return self._read(breaker) if breaker is not None and breaker.tenant_id == tenant_id else None

    async def ensure_breakers(self, handlers: Sequence[tuple[str, str, str]], since: datetime) -> None:
        """A CLOSED breaker counting from ``since`` for each handler of a registered tenant that has none yet."""
        known = {(b.tenant_id, b.pool, b.handler) for b in self._breakers.values()}
        now = self._clock.now()
        for tenant_id, pool, handler in handlers:
            if (tenant_id, pool, handler) in known or not await self._registered(tenant_id):
                continue
            breaker = new_breaker(tenant_id, pool, handler, since, now)
            self._breakers[breaker.id] = breaker
            known.add((tenant_id, pool, handler))

    async def record_window(self, windows: Sequence[tuple[UUID, int, int]]) -> None:
        for breaker_id, attempts, failures in windows:
            if (breaker := self._breakers.get(breaker_id)) is not None:
                self._breakers[breaker_id] = dataclasses.replace(breaker, attempts=attempts, failures=failures)

    async def transition(self, move: Transition) -> Breaker | None:
        """Compare-and-set ``move`` on the breaker's version; None when the breaker changed meanwhile."""
        b = self._breakers.get(move.breaker.id)
        if b is None or b.version != move.breaker.version:
            return None
        now = self._clock.now()
        to = move.to_state
        moved = dataclasses.replace(
            b,
            state=to,
            since=b.since if to == OPEN else (move.since or now),
            since_attempts=b.since_attempts if to == OPEN else move.since_attempts,
            since_failures=b.since_failures if to == OPEN else move.since_failures,
            opened_at=None if to == CLOSED else (now if b.state == CLOSED else b.opened_at),
            next_probe_at=None if move.next_probe_in_sec is None else now + timedelta(seconds=move.next_probe_in_sec),
            cooldown_sec=move.cooldown_sec,
            probe_limit=move.probe_limit,
            probes_sent=0,
            manual=move.manual,
            attempts=move.attempts,
            failures=move.failures,
            max_hold_sec=b.max_hold_sec if move.max_hold_sec is None else move.max_hold_sec,
            opens=b.opens + (1 if to == OPEN else 0),
            version=b.version + 1,
            updated_at=now,
        )
        self._breakers[b.id] = moved
        return dataclasses.replace(moved, held=0, probe_due=False)

    async def release_held(self, breaker_id: UUID, spread_sec: float) -> list[Released]:
        return []  # no executions, so no retry is held

    async def release_first_fires(self, breaker: Breaker, spread_sec: float) -> list[Released]:
        return []  # no jobs, so no first fire is held

    async def _registered(self, tenant_id: str) -> bool:
        return self._tenants is None or await self._tenants.get_tenant(tenant_id) is not None

    def _read(self, breaker: Breaker) -> Breaker:
        """A breaker as a read hands it out: nothing held, its probe due once its time has come."""
        due = breaker.next_probe_at is not None and breaker.next_probe_at <= self._clock.now()
        return dataclasses.replace(breaker, held=0, probe_due=due)


def new_breaker(tenant_id: str, pool: str, handler: str, since: datetime, now: datetime) -> Breaker:
    """A CLOSED breaker counting from ``since``, made at ``now``: a row of ``breakers`` as its column defaults make
    it (for tests that build the breaker a decision starts from)."""
    return Breaker(
        id=uuid.uuid4(),
        tenant_id=tenant_id,
        pool=pool,
        handler=handler,
        state=CLOSED,
        since=since,
        since_attempts=0,
        since_failures=0,
        attempts=0,
        failures=0,
        opened_at=None,
        next_probe_at=None,
        cooldown_sec=0.0,
        probe_limit=0,
        probes_sent=0,
        opens=0,
        manual=False,
        version=1,
        updated_at=now,
    )
