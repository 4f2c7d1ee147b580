"""How a test gets a pool its jobs may use: ``admit(database_url, "demo", "acme")``.

The API refuses a job whose ``target.pool`` is not registered (422) or does not admit the caller's tenant (403),
and a worker refuses the executions of tenants its pool does not admit. So a test registers every pool it sends
work into, for every tenant that sends it: :func:`admit` (or ``tenant_token(db, tenant, pools=[...])`` from
:mod:`tests.support.tenants`, which calls it). The first tenant admitted owns the pool; admitting another makes the pool
shared among them — a test never has to care which. Idempotent, synchronous (fixtures, harnesses and sync tests
alike; it runs on a thread of its own inside a running event loop), once per (database, pool, tenant) a session.
:func:`register_pool` writes one registry entry exactly (a test about the registry itself).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from typing import Any

import asyncpg

_admitted: set[tuple[str, str, str]] = set()
_lock = threading.Lock()

_ADMIT = """
INSERT INTO pools (name, owner, kind) VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE SET
    owner = CASE WHEN pools.owner = EXCLUDED.owner THEN pools.owner END,
    shared_with = CASE
        WHEN pools.owner = EXCLUDED.owner OR EXCLUDED.owner = ANY (pools.shared_with) THEN pools.shared_with
        WHEN pools.owner IS NOT NULL THEN ARRAY[pools.owner, EXCLUDED.owner]
        ELSE pools.shared_with || EXCLUDED.owner
    END
"""


def _run(coro: Coroutine[Any, Any, None]) -> None:
    error: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(coro)
        except BaseException as exc:  # re-raised in the caller's thread
            error.append(exc)

    thread = threading.Thread(target=run, name="register-pool")
    thread.start()
    thread.join()
    if error:
        raise error[0]


async def admit_async(database_url: str, pool: str, tenant: str, kind: str = "production") -> None:
    """Make ``pool`` admit ``tenant`` (registering both if needed) in the registry at ``database_url``."""
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            await conn.execute("INSERT INTO tenants (id) VALUES ($1) ON CONFLICT (id) DO NOTHING", tenant)
            await conn.execute(_ADMIT, pool, tenant, kind)
    finally:
        await conn.close()


def admit(database_url: str, pool: str, *tenants: str, kind: str = "production") -> str:
    """Make ``pool`` admit each of ``tenants`` (owned by the first, shared once there are several); returns ``pool``.

    ``kind="staging"`` registers a staging pool (a replay's target); an existing pool keeps its kind.
    """
    with _lock:
        for tenant in tenants:
            key = (database_url, pool, tenant)
            if key not in _admitted:
                _run(admit_async(database_url, pool, tenant, kind))
                _admitted.add(key)
    return pool


async def register_pool(
    database_url: str,
    name: str,
    *,
    owner: str | None = None,
    shared_with: Sequence[str] = (),
    kind: str = "production",
    **fields: Any,
) -> None:
    """Write the registry entry of ``name`` exactly (replacing any), its tenants registered if they are not."""
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            for tenant in [*([owner] if owner else []), *shared_with]:
                await conn.execute("INSERT INTO tenants (id) VALUES ($1) ON CONFLICT (id) DO NOTHING", tenant)
            await conn.execute("DELETE FROM pools WHERE name = $1", name)
            columns = ["name", "owner", "shared_with", "kind", *fields]
            values = [name, owner, list(shared_with), kind, *fields.values()]
            placeholders = ", ".join(f"${i}" for i in range(1, len(values) + 1))
            await conn.execute(f"INSERT INTO pools ({', '.join(columns)}) VALUES ({placeholders})", *values)
    finally:
        await conn.close()
    with _lock:  # the entry was replaced: admit() must write again
        for key in [k for k in _admitted if k[0] == database_url and k[1] == name]:
            _admitted.discard(key)
