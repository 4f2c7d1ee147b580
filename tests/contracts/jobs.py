"""The job and idempotency stores under contract, of one implementation: in memory, or on Postgres."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from sundial_common.domain.ids import new_id
from sundial_common.stores import Stores
from sundial_common.stores.idempotency import IdempotencyStore
from sundial_common.stores.jobs import JobStore
from sundial_common.testing import InMemoryIdempotencyStore, InMemoryJobStore, InMemoryTenantStore


@dataclass(frozen=True, slots=True)
class Jobs:
    """One implementation's job store, and its idempotency store over the same jobs."""

    store: JobStore
    idempotency: IdempotencyStore

    @classmethod
    def in_memory(cls) -> Jobs:
        jobs = InMemoryJobStore(InMemoryTenantStore())
        return cls(jobs, InMemoryIdempotencyStore(jobs))

    @classmethod
    def postgres(cls, stores: Stores) -> Jobs:
        return cls(stores.jobs, stores.idempotency)


def one_shot(due: datetime | None, tenant: str = "acme", **columns: Any) -> dict[str, Any]:
    """A ONE_SHOT job's column values, due at ``due`` in shard 0 (as the API writes them)."""
    values: dict[str, Any] = {
        "id": new_id(),
        "tenant_id": tenant,
        "name": "report",
        "type": "ONE_SHOT",
        "run_at": due,
        "pool": "demo",
        "handler": "echo",
        "timeout_sec": 30,
        "shard": 0,
        "next_fire_at": due,
    }
    return {**values, **columns}


def later(at: datetime, seconds: float) -> datetime:
    """``at`` moved by ``seconds``, at the millisecond precision fire times are kept at."""
    moved = at + timedelta(seconds=seconds)
    return moved.replace(microsecond=moved.microsecond // 1000 * 1000)


def ids(rows: list[Any]) -> list[UUID]:
    return [row["id"] for row in rows]
