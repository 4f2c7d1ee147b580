"""The idempotency store: Idempotency-Key claims, the responses they answer retries with, and their purge.

A ``POST`` that creates jobs claims its key first; the jobs and the key's completion then commit in one
transaction (:meth:`PostgresIdempotencyStore.insert_job_idempotent`), so a retry can never create a second
one. The sweeper purges keys past their lifetime. SQL: ``sql/idempotency.sql`` (the inserts themselves are
the job store's, :mod:`sundial_common.stores.jobs`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast
from uuid import UUID

import asyncpg

from sundial_common.stores.database import Database
from sundial_common.stores.dependencies import Edge, insert_dependent_job_on
from sundial_common.stores.jobs import insert_job_on, insert_jobs_on
from sundial_common.stores.queries import load_file
from sundial_common.stores.types import Record

Q = load_file("idempotency.sql")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class IdempotentResponse:
    """What a ``POST`` with an Idempotency-Key answered, kept to answer its retries the same way."""

    status_code: int
    headers: dict[str, str]
    body: bytes
    resource_id: UUID | None


class IdempotencyStore(Protocol):
    """Idempotency-Key claims, and the job inserts that complete them."""

    async def claim_idempotency_key(
        self, tenant_id: str, key: str, request_hash: bytes, token: UUID, lock_sec: float, ttl_sec: float
    ) -> bool: ...

    async def get_idempotency_key(self, tenant_id: str, key: str) -> Record | None: ...

    async def release_idempotency_key(self, tenant_id: str, key: str, token: UUID) -> None: ...

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
    ) -> tuple[Record, IdempotentResponse] | None: ...

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
    ) -> tuple[list[Record], IdempotentResponse] | None: ...

    async def purge_idempotency_keys(self, limit: int) -> int: ...


class PostgresIdempotencyStore:
    """:class:`IdempotencyStore` over the shared pool."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def claim_idempotency_key(
        self, tenant_id: str, key: str, request_hash: bytes, token: UUID, lock_sec: float, ttl_sec: float
    ) -> bool:
        """Take ``key`` for this request (new, expired, or an abandoned claim of the same body)."""
        row = await self._db.pool.fetchrow(
            Q["claim_idempotency_key"], tenant_id, key, request_hash, token, lock_sec, ttl_sec
        )
        return row is not None

    async def get_idempotency_key(self, tenant_id: str, key: str) -> Record | None:
        return cast(Record | None, await self._db.pool.fetchrow(Q["get_idempotency_key"], tenant_id, key))

    async def release_idempotency_key(self, tenant_id: str, key: str, token: UUID) -> None:
        await self._db.pool.execute(Q["release_idempotency_key"], tenant_id, key, token)

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
        """``insert_job`` and the key's completion in one transaction: the job exists iff the key answers
        with it, so a retry can never create a second one. None (and nothing written) if the claim was taken
        over meanwhile. ``parents``: a DEPENDENT job's edges, written (and checked) with it.
        """

        async def insert(conn: asyncpg.Connection) -> Record:
            if parents:
                return await insert_dependent_job_on(conn, values, parents, actor, max_active_jobs=max_active_jobs)
            return await insert_job_on(conn, values, actor, max_active_jobs=max_active_jobs)

        return await self._insert_once(values["tenant_id"], key, token, insert, respond)

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
        """``insert_jobs`` and the key's completion in one transaction (see :meth:`insert_job_idempotent`)."""

        async def insert(conn: asyncpg.Connection) -> list[Record]:
            return await insert_jobs_on(conn, jobs, actor, max_active_jobs=max_active_jobs)

        return await self._insert_once(tenant_id, key, token, insert, respond)

    async def purge_idempotency_keys(self, limit: int) -> int:
        status = await self._db.pool.execute(Q["purge_idempotency_keys"], limit)
        return int(status.split()[-1])

    async def _insert_once(
        self,
        tenant_id: str,
        key: str,
        token: UUID,
        insert: Callable[[asyncpg.Connection], Awaitable[_T]],
        respond: Callable[[_T], IdempotentResponse],
    ) -> tuple[_T, IdempotentResponse] | None:
        try:
            async with self._db.pool.acquire() as conn, conn.transaction():
                created = await insert(conn)
                response = respond(created)
                completed = await conn.fetchval(
                    Q["complete_idempotency_key"],
                    tenant_id,
                    key,
                    token,
                    response.status_code,
                    response.headers,
                    response.body,
                    response.resource_id,
                )
                if completed is None:
                    raise _ClaimLost  # leaving the block by an exception rolls the insert back
        except _ClaimLost:
            return None
        return created, response


class _ClaimLost(Exception):
    """Rolls back a transaction whose idempotency claim another request took over."""
