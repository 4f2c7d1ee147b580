"""Jobs registered straight into Postgres, as a bulk registration would: sealed, admitted to the pool, in the hot
window when near due — what the API would leave, without the API's cost in the figures."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import orjson
from redis.asyncio import Redis
from sundial_common.domain.ids import new_id, shard_for
from sundial_common.hotwindow.window import HotWindow
from sundial_common.runtime.settings import EncryptionSettings
from sundial_common.security.encryption import PAYLOAD, TenantCipher, open_keyring
from sundial_common.stores import Stores
from sundial_common.stores.types import Occurrence
from sundial_infra.stack import LocalStack

#: The pool every bench job runs in (registered by the harness' ``migrate --pool``).
POOL = "demo"
#: Make the pool admit one more tenant (shared among every bench tenant; registered by `migrate --pool`).
ADMIT = """
UPDATE pools SET owner = NULL,
    shared_with = (SELECT array_agg(DISTINCT t ORDER BY t) FROM unnest(shared_with || ARRAY[owner, $2]) AS t
                   WHERE t IS NOT NULL)
WHERE name = $1
"""


async def tenant_cipher(stack: LocalStack, root: Path, tenant: str) -> TenantCipher:
    """The tenant's data key, from the stack's master key under ``root``: the bench registers jobs sealed, as the
    API does."""
    stores = await Stores.connect(stack.postgres_dsn, min_size=1, max_size=1)
    try:
        settings = EncryptionSettings(env="dev", dev_root=str(root))
        return await (await open_keyring(settings, stores.keys)).cipher(tenant)
    finally:
        await stores.close()


async def insert_jobs(
    stack: LocalStack,
    root: Path,
    shards: int,
    tenant: str,
    due: Sequence[datetime],
    *,
    handler: str = "echo",
    payload: dict[str, Any] | None = None,
    priority: str = "NORMAL",
) -> float:
    """COPY one-shot jobs due at ``due`` into ``stack``'s Postgres over ``shards`` shards (``echo`` of ``{"i": i}``
    unless told); returns seconds taken."""
    conn = await asyncpg.connect(stack.postgres_dsn)
    try:
        started = time.perf_counter()
        await conn.execute("INSERT INTO tenants (id) VALUES ($1) ON CONFLICT DO NOTHING", tenant)
        cipher = await tenant_cipher(stack, root, tenant)
        await conn.execute(ADMIT, POOL, tenant)  # the workers run only tenants their pool admits
        records = []
        for i, instant in enumerate(due):
            job_id = new_id()
            records.append(
                (
                    job_id,
                    tenant,
                    f"bench-{i}",
                    "ONE_SHOT",
                    instant,
                    POOL,
                    handler,
                    # sealed, as the API does
                    orjson.dumps(cipher.seal_json({"i": i} if payload is None else payload, PAYLOAD)).decode(),
                    60,
                    "ACTIVE",
                    shard_for(job_id, shards),
                    instant,
                    priority,
                )
            )
        await conn.copy_records_to_table(
            "jobs",
            records=records,
            columns=[
                "id",
                "tenant_id",
                "name",
                "type",
                "run_at",
                "pool",
                "handler",
                "payload",
                "timeout_sec",
                "state",
                "shard",
                "next_fire_at",
                "priority",
            ],
        )
        # Like the API, the registrar puts near-due jobs into the hot window itself: the hydrator
        # only promotes beyond its watermark (and re-adds overdue jobs after a grace).
        redis = Redis.from_url(stack.redis_url)
        try:
            hot = HotWindow(redis)
            by_shard: dict[int, list[Occurrence]] = {}
            for r in records:
                by_shard.setdefault(r[10], []).append(Occurrence(r[0], r[11]))
            for shard, occurrences in by_shard.items():
                for offset in range(0, len(occurrences), 5000):
                    await hot.add(shard, occurrences[offset : offset + 5000])
        finally:
            await redis.aclose()
        return time.perf_counter() - started
    finally:
        await conn.close()
