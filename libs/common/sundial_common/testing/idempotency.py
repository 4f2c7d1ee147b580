"""InMemoryIdempotencyStore: Idempotency-Key claims and their responses in a dict, over an in-memory job store, for
tests of the logic that answers a retried create."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar
from uuid import UUID

from sundial_common.runtime.clock import Clock, SystemClock
from sundial_common.stores.dependencies import Edge
from sundial_common.stores.idempotency import IdempotentResponse
from sundial_common.stores.types import Record
from sundial_common.testing.jobs import InMemoryJobStore

_T = TypeVar("_T")


class InMemoryIdempotencyStore:
    """:class:`~sundial_common.stores.idempotency.IdempotencyStore` over a dict, writing its jobs into ``jobs``: a
    claim is taken, answered or released as in Postgres, on ``clock``'s time; the jobs of a create and its key's
    answer are written together or not at all. The in-memory stores hold no dependency graph: a DEPENDENT job's
    ``parents`` are refused (``ValueError``)."""

    def __init__(self, jobs: InMemoryJobStore, clock: Clock | None = None) -> None:
        self._jobs = jobs
        self._clock = clock or SystemClock()
        self._keys: dict[tuple[str, str], dict[str, Any]] = {}

    async def claim_idempotency_key(
        self, tenant_id: str, key: str, request_hash: bytes, token: UUID, lock_sec: float, ttl_sec: float
    ) -> bool:
        """Take ``key`` for this request: new, expired, or an abandoned claim of the same body."""
        now = self._clock.now()
        held = self._keys.get((tenant_id, key))
        if held is not None and not (
            held["expires_at"] < now
            or (held["state"] == "IN_FLIGHT" and held["locked_until"] < now and held["request_hash"] == request_hash)
        ):
            return False
        self._keys[(tenant_id, key)] = {
            "tenant_id": tenant_id,
            "key": key,
            "request_hash": request_hash,
            "token": token,
            "state": "IN_FLIGHT",
            "locked_until": now + timedelta(seconds=lock_sec),
            "expires_at": now + timedelta(seconds=ttl_sec),
            "status_code": None,
            "headers": None,
            "body": None,
            "resource_id": None,
            "created_at": now,
        }
        return True

    async def get_idempotency_key(self, tenant_id: str, key: str) -> Record | None:
        now = self._clock.now()
        row = self._keys.get((tenant_id, key))
        if row is None or row["expires_at"] < now:
            return None
        headers = dict(row["headers"]) if row["headers"] is not None else None
        return {**row, "headers": headers, "lock_expired": _before(row["locked_until"], now)}

    async def release_idempotency_key(self, tenant_id: str, key: str, token: UUID) -> None:
        if self._held(tenant_id, key, token):
            del self._keys[(tenant_id, key)]

    async def insert_job_idempotent(
        self,
        values: dict[str, Any],
        actor: str,
        *,
        key: str,
        token: UUID,
        respond: Callable[[Record], IdempotentResponse],
        max_active_jobs: int | None = None,
        parents: Sequence[Edge] = (),
    ) -> tuple[Record, IdempotentResponse] | None:
        """The job and the key's answer together; None (nothing written) if the claim was taken over meanwhile."""
        if parents:
            raise ValueError("the in-memory stores hold no dependency graph: a DEPENDENT job needs Postgres")

        async def insert() -> Record:
            return await self._jobs.insert_job(values, actor, max_active_jobs=max_active_jobs)

        return await self._insert_once(values["tenant_id"], key, token, insert, lambda row: [row["id"]], respond)

    async def insert_jobs_idempotent(
        self,
        jobs: Sequence[Mapping[str, Any]],
        actor: str,
        *,
        tenant_id: str,
        key: str,
        token: UUID,
        respond: Callable[[list[Record]], IdempotentResponse],
        max_active_jobs: int | None = None,
    ) -> tuple[list[Record], IdempotentResponse] | None:
        """The jobs and the key's answer together (see :meth:`insert_job_idempotent`)."""

        async def insert() -> list[Record]:
            return await self._jobs.insert_jobs(jobs, actor, max_active_jobs=max_active_jobs)

        return await self._insert_once(tenant_id, key, token, insert, lambda rows: [r["id"] for r in rows], respond)

    async def purge_idempotency_keys(self, limit: int) -> int:
        """Delete up to ``limit`` keys past their lifetime, the longest expired first; how many."""
        now = self._clock.now()
        old = sorted((row["expires_at"], k) for k, row in self._keys.items() if row["expires_at"] < now)[:limit]
        for _, k in old:
            del self._keys[k]
        return len(old)

    def _held(self, tenant_id: str, key: str, token: UUID) -> bool:
        row = self._keys.get((tenant_id, key))
        return row is not None and row["token"] == token and row["state"] == "IN_FLIGHT"

    async def _insert_once(
        self,
        tenant_id: str,
        key: str,
        token: UUID,
        insert: Callable[[], Awaitable[_T]],
        written: Callable[[_T], list[UUID]],
        respond: Callable[[_T], IdempotentResponse],
    ) -> tuple[_T, IdempotentResponse] | None:
        if not self._held(tenant_id, key, token):
            return None  # taken over: Postgres would roll the insert back
        created = await insert()
        try:
            response = respond(created)
        except BaseException:
            self._jobs.forget(written(created))  # as the transaction's rollback would
            raise
        self._keys[(tenant_id, key)].update(
            state="DONE",
            status_code=response.status_code,
            headers=dict(response.headers),
            body=response.body,
            resource_id=response.resource_id,
            locked_until=None,
        )
        return created, response


def _before(at: Any, now: Any) -> bool | None:
    """``at < now`` as SQL has it: unknown (None) when ``at`` is NULL."""
    return None if at is None else bool(at < now)
