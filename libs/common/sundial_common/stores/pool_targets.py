"""The pool-target store: where an HTTP pool's executions are delivered.

A pool whose ``delivery`` is ``http`` has one target: a base URL, optional per-handler paths and the signing
secrets (sealed under the owning tenant's data key, opened only by the delivery worker and the API). The owning
tenant sets it (``PUT /v1/pools/{name}/target``); the delivery worker reads it through a short cache.
SQL: ``sql/pool_targets.sql``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sundial_common.stores.database import Database
from sundial_common.stores.queries import load_file
from sundial_common.stores.types import Record

Q = load_file("pool_targets.sql")


@dataclass(frozen=True, slots=True)
class PoolTarget:
    pool: str
    tenant_id: str
    url: str
    #: Handler name -> path appended to ``url`` (a handler not listed is POSTed to ``url`` itself).
    paths: dict[str, str]
    #: The signing secrets, sealed (newest first once opened).
    sealed_secrets: str
    updated_by: str
    created_at: datetime
    updated_at: datetime

    def url_for(self, handler: str) -> str:
        path = self.paths.get(handler)
        if path is None:
            return self.url
        return self.url.rstrip("/") + "/" + path.lstrip("/")

    @classmethod
    def from_row(cls, row: Record) -> PoolTarget:
        return cls(
            pool=row["pool"],
            tenant_id=row["tenant_id"],
            url=row["url"],
            paths=dict(row["paths"] or {}),
            sealed_secrets=row["secrets"],
            updated_by=row["updated_by"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )


class PoolTargetStore:
    """Targets over the shared pool."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def put_target(
        self, pool: str, tenant: str, url: str, paths: dict[str, Any], sealed_secrets: str | None, actor: str
    ) -> PoolTarget:
        """Set ``pool``'s target; ``sealed_secrets`` None keeps the secrets it has."""
        row = await self._db.pool.fetchrow(Q["put_target"], pool, tenant, url, paths, sealed_secrets, actor)
        assert row is not None
        return PoolTarget.from_row(row)

    async def get_target(self, pool: str) -> PoolTarget | None:
        row = await self._db.pool.fetchrow(Q["get_target"], pool)
        return PoolTarget.from_row(row) if row is not None else None

    async def delete_target(self, pool: str) -> bool:
        return await self._db.pool.fetchrow(Q["delete_target"], pool) is not None
