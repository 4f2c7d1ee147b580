"""The pool-token store: the registry of pool tokens — which pool and tenant each serves, who minted it, the
lifetime of its refreshed JWTs, and whether it was revoked.

The API writes it (``POST /v1/pools/{name}/tokens``, ``DELETE …/tokens/{id}``); the worker gateway reads a token's
row on use, through a short cache, so a revoked token stops working within that cache's time. SQL:
``sql/pool_tokens.sql``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from sundial_common.stores.database import Database
from sundial_common.stores.queries import load_file
from sundial_common.stores.types import Record

Q = load_file("pool_tokens.sql")


@dataclass(frozen=True, slots=True)
class PoolTokenRecord:
    id: str
    pool: str
    #: The one tenant whose work the token may take.
    tenant: str
    #: Who holds it (the JWT's ``sub``): a name for logs, e.g. ``billing-workers``.
    subject: str
    #: Who minted it (the minting token's subject).
    created_by: str
    #: Lifetime of each JWT issued for it, the first and every refresh.
    ttl_sec: int
    created_at: datetime
    revoked_at: datetime | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    @classmethod
    def from_row(cls, row: Record) -> PoolTokenRecord:
        return cls(
            id=row["id"],
            pool=row["pool"],
            tenant=row["tenant"],
            subject=row["subject"],
            created_by=row["created_by"],
            ttl_sec=row["ttl_sec"],
            created_at=row["created_at"],
            revoked_at=row["revoked_at"],
        )


class PoolTokenStore(Protocol):
    """The pool-token registry."""

    async def create_token(
        self, token_id: str, pool: str, tenant: str, subject: str, created_by: str, ttl_sec: int
    ) -> PoolTokenRecord: ...

    async def get_token(self, token_id: str) -> PoolTokenRecord | None: ...

    async def list_tokens(self, pool: str, limit: int) -> list[PoolTokenRecord]: ...

    async def revoke_token(self, token_id: str, pool: str) -> PoolTokenRecord | None: ...


class PostgresPoolTokenStore:
    """:class:`PoolTokenStore` over the shared pool."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def create_token(
        self, token_id: str, pool: str, tenant: str, subject: str, created_by: str, ttl_sec: int
    ) -> PoolTokenRecord:
        row = await self._db.pool.fetchrow(Q["create_token"], token_id, pool, tenant, subject, created_by, ttl_sec)
        assert row is not None
        return PoolTokenRecord.from_row(row)

    async def get_token(self, token_id: str) -> PoolTokenRecord | None:
        row = await self._db.pool.fetchrow(Q["get_token"], token_id)
        return PoolTokenRecord.from_row(row) if row is not None else None

    async def list_tokens(self, pool: str, limit: int) -> list[PoolTokenRecord]:
        """``pool``'s tokens, newest first, revoked ones included."""
        return [PoolTokenRecord.from_row(r) for r in await self._db.pool.fetch(Q["list_tokens"], pool, limit)]

    async def revoke_token(self, token_id: str, pool: str) -> PoolTokenRecord | None:
        """Revoke ``pool``'s token ``token_id`` (again: nothing changes); None when ``pool`` has no such token."""
        row = await self._db.pool.fetchrow(Q["revoke_token"], token_id, pool)
        return PoolTokenRecord.from_row(row) if row is not None else None
