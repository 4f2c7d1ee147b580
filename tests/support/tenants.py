"""How a test gets a bearer token: ``tenant_token(database_url, "acme")``.

The API accepts tokens only for registered, active tenants, so a plain ``issue_token`` is refused (401) unless
its tenant is in the registry of the database the API uses. :func:`tenant_token` registers the tenant there
(idempotent; registry fields may be given, e.g. ``weight=2``, ``max_active_jobs=10``) and mints its token. It
is synchronous so fixtures, harnesses and sync tests alike can call it; it works inside a running event loop
too (the registration runs on a thread of its own). Each (database, tenant) is registered once per session.
``pools=["demo"]`` also makes those pools admit the tenant (:func:`tests.support.pools.admit`): the API refuses work
for a pool that is not registered or not open to the caller's tenant.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from typing import Any

import asyncpg
from sundial_common.runtime.settings import CommonSettings
from sundial_common.security.auth import issue_token

from tests.support.pools import admit

_registered: set[tuple[str, str]] = set()
_lock = threading.Lock()

_COLUMNS = frozenset(
    {
        "display_name",
        "weight",
        "max_active_jobs",
        "max_creates_per_sec",
        "max_concurrent_executions",
        "max_dispatch_per_sec",
        "default_jitter_sec",
        "state",
    }
)


async def register_tenant(database_url: str, tenant: str, **fields: Any) -> None:
    """Register ``tenant`` (or, if it exists, set ``fields`` on it) in the registry at ``database_url``."""
    unknown = set(fields) - _COLUMNS
    if unknown:
        raise TypeError(f"not a registry field: {sorted(unknown)}")
    names = ["id", *fields]
    values = [tenant, *fields.values()]
    placeholders = ", ".join(f"${i}" for i in range(1, len(names) + 1))
    updates = ", ".join(f"{n} = EXCLUDED.{n}" for n in fields) or "id = EXCLUDED.id"
    conn = await asyncpg.connect(database_url)
    try:
        insert = f"INSERT INTO tenants ({', '.join(names)}) VALUES ({placeholders})"
        await conn.execute(f"{insert} ON CONFLICT (id) DO UPDATE SET {updates}", *values)
    finally:
        await conn.close()


def tenant_token(
    database_url: str,
    tenant: str,
    *,
    admin: bool = False,
    secret: str | None = None,
    pools: Iterable[str] = (),
    **fields: Any,
) -> str:
    """Register ``tenant`` in ``database_url``'s registry (once), let it use ``pools``, return a bearer token."""
    key = (database_url, tenant)
    with _lock:
        if key not in _registered or fields:
            error: list[BaseException] = []

            def run() -> None:
                try:
                    asyncio.run(register_tenant(database_url, tenant, **fields))
                except BaseException as exc:  # re-raised in the caller's thread
                    error.append(exc)

            thread = threading.Thread(target=run, name="register-tenant")
            thread.start()
            thread.join()
            if error:
                raise error[0]
            _registered.add(key)
    for pool in pools:
        admit(database_url, pool, tenant)
    return issue_token(secret or CommonSettings().jwt_secret, tenant, admin=admin)
