"""The audit store: a job's or an execution's audit trail as ``GET /v1/jobs/{id}/audit`` and
``GET /v1/executions/{id}/audit`` page through it, and execution events recorded outside a state change.

The trail lives in ``audit_log`` (migration 0001: append-only, a trigger refuses UPDATE and DELETE). Each row
is written by the statement that makes the change it records — the API's mutations (create, batch create,
PATCH with the changed fields before and after, pause, resume, trigger, DELETE, an execution's cancel and retry,
with the token's subject as actor) and every execution transition (dispatched, skipped, started, finished,
retried, dead, cancelled, swept, with the process as actor): one extra ``INSERT … SELECT`` step per batched
statement, never a round trip of its own, and never a row without its change or a change without its row.

Only what changes no execution row comes through here: :meth:`AuditStore.record_execution_events` (e.g. a
worker refusing a message of a tenant its pool does not serve), one statement per batch.
SQL: ``sql/audit.sql``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, cast
from uuid import UUID

from sundial_common.stores.database import Database
from sundial_common.stores.queries import load_file

Q = load_file("audit.sql")

Entity = Literal["job", "execution", "breaker"]


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One row of a trail: what happened (``action``), the state before and after, who, when, and details."""

    id: int
    at: datetime
    action: str
    from_state: str | None
    to_state: str | None
    actor: str
    detail: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class ExecutionEvent:
    """An event about an execution that changes no execution row; ``actor`` is who saw it (a worker id)."""

    execution_id: UUID
    action: str
    actor: str
    detail: Mapping[str, Any] = field(default_factory=dict)


class AuditStore(Protocol):
    async def entries(
        self,
        tenant_id: str,
        entity: Entity,
        entity_id: UUID,
        *,
        after: int = 0,
        actions: Sequence[str] | None = None,
        limit: int = 100,
    ) -> list[AuditEntry]:
        """The entity's trail, oldest first, after row id ``after``; empty for another tenant's entity."""
        ...

    async def record_execution_events(self, events: Sequence[ExecutionEvent]) -> int:
        """Append ``events`` (one statement); the number recorded (events of unknown executions are dropped)."""
        ...

    async def newest_id(self) -> int:
        """The highest audit row id written so far (0 for none)."""
        ...

    async def changes_since(self, after: int) -> tuple[dict[str, tuple[int, int]], int]:
        """Per tenant, how many audit rows have an id above ``after`` and the sum of their ids; and the highest id."""
        ...


class PostgresAuditStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def entries(
        self,
        tenant_id: str,
        entity: Entity,
        entity_id: UUID,
        *,
        after: int = 0,
        actions: Sequence[str] | None = None,
        limit: int = 100,
    ) -> list[AuditEntry]:
        rows = await self._db.pool.fetch(
            Q["entries"], entity_id, tenant_id, entity, after, list(actions) if actions else None, limit
        )
        return [
            AuditEntry(
                id=row["id"],
                at=row["at"],
                action=row["action"],
                from_state=row["from_state"],
                to_state=row["to_state"],
                actor=row["actor"],
                detail=cast(Mapping[str, Any] | None, row["detail"]),
            )
            for row in rows
        ]

    async def record_execution_events(self, events: Sequence[ExecutionEvent]) -> int:
        if not events:
            return 0
        rows = await self._db.pool.fetch(
            Q["record_execution_events"],
            [event.execution_id for event in events],
            [event.action for event in events],
            [event.actor for event in events],
            [dict(event.detail) for event in events],
        )
        return len(rows)

    async def newest_id(self) -> int:
        return int(await self._db.pool.fetchval(Q["newest_id"]))

    async def changes_since(self, after: int) -> tuple[dict[str, tuple[int, int]], int]:
        rows = await self._db.pool.fetch(Q["changes_since"], after)
        changes = {row["tenant_id"]: (int(row["changed"]), int(row["ids"])) for row in rows}
        return changes, max((int(row["newest"]) for row in rows), default=after)


async def record_execution_event(store: AuditStore, execution_id: UUID, action: str, actor: str, **detail: Any) -> bool:
    """Record one event about an execution in its trail (``GET /v1/executions/{id}/audit``); True if recorded.

    For events that change no execution row — e.g. a worker refusing a message of a tenant its pool does not
    serve: ``await record_execution_event(stores.audit, execution_id, "refused", worker_id, tenant=...,
    reason=...)``. A caller with many events batches them with :meth:`AuditStore.record_execution_events`.
    """
    return await store.record_execution_events([ExecutionEvent(execution_id, action, actor, detail)]) == 1
