"""The tenant's job listing (``GET /v1/jobs``): one named query in ``sql/job_listing.sql``.

Kept out of :mod:`sundial_common.store` and ``sql/queries.sql`` while those are being split per domain;
it belongs with the jobs store once that exists (the query moves into its ``.sql`` file, the function
becomes a method of the jobs store).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from typing import cast
from uuid import UUID

import asyncpg

from sundial_common.queries import load
from sundial_common.store import Record

Q = load(files("sundial_common").joinpath("sql/job_listing.sql").read_text())


@dataclass(frozen=True, slots=True)
class JobFilter:
    """What to list; None means "any". ``name_prefix`` matches the start of the name."""

    state: str | None = None
    type: str | None = None
    pool: str | None = None
    handler: str | None = None
    name_prefix: str | None = None


async def list_jobs(
    pool: asyncpg.Pool, tenant_id: str, where: JobFilter, before: UUID | None, limit: int
) -> list[Record]:
    """Up to ``limit`` of the tenant's jobs matching ``where``, newest first, with ids below ``before``."""
    rows = await pool.fetch(
        Q["list_jobs"],
        tenant_id,
        where.state,
        where.type,
        where.pool,
        where.handler,
        where.name_prefix,
        before,
        limit,
    )
    return cast(list[Record], rows)
