"""The keys store: tenants' data keys, wrapped by the master key, and that master key's check value.

A data key is only ever stored wrapped (:mod:`sundial_common.security.encryption`); ``encryption_master`` is one row
saying which master key wraps them (``key_check``) and, during ``sundial keys rotate``, which one it is moving
to (``rotating_to``). SQL: ``sql/keys.sql``.
"""

from __future__ import annotations

from typing import Protocol

from sundial_common.stores.database import Database
from sundial_common.stores.queries import load_file

Q = load_file("keys.sql")


class KeyStore(Protocol):
    """Wrapped data keys and the master key record (the :class:`~sundial_common.security.encryption.DataKeyStore`
    the keyring reads, plus what a rotation writes)."""

    async def master_check_values(self) -> tuple[str | None, str | None]: ...

    async def record_master_check_value(self, check_value: str) -> None: ...

    async def wrapped_data_keys(self, tenants: list[str]) -> dict[str, tuple[bytes, str]]: ...

    async def add_data_key(self, tenant_id: str, wrapped: bytes, check_value: str) -> bool: ...

    async def begin_rotation(self, old: str, new: str) -> bool: ...

    async def count_data_keys(self, check_value: str) -> tuple[int, int]: ...

    async def data_keys_to_rewrap(self, check_value: str, limit: int) -> list[tuple[str, bytes]]: ...

    async def rewrap_data_keys(self, rewrapped: list[tuple[str, bytes]], old: str, new: str) -> int: ...

    async def finish_rotation(self, old: str, new: str) -> bool: ...


class PostgresKeyStore:
    """:class:`KeyStore` over the shared pool."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def master_check_values(self) -> tuple[str | None, str | None]:
        row = await self._db.pool.fetchrow(Q["master_check_values"])
        return (None, None) if row is None else (row["key_check"], row["rotating_to"])

    async def record_master_check_value(self, check_value: str) -> None:
        await self._db.pool.execute(Q["record_master_check_value"], check_value)

    async def wrapped_data_keys(self, tenants: list[str]) -> dict[str, tuple[bytes, str]]:
        rows = await self._db.pool.fetch(Q["wrapped_data_keys"], tenants)
        return {row["tenant_id"]: (bytes(row["wrapped_key"]), row["key_check"]) for row in rows}

    async def add_data_key(self, tenant_id: str, wrapped: bytes, check_value: str) -> bool:
        return await self._db.pool.fetchval(Q["add_data_key"], tenant_id, wrapped, check_value) is not None

    async def begin_rotation(self, old: str, new: str) -> bool:
        return await self._db.pool.fetchval(Q["begin_rotation"], old, new) is not None

    async def count_data_keys(self, check_value: str) -> tuple[int, int]:
        row = await self._db.pool.fetchrow(Q["count_data_keys"], check_value)
        assert row is not None  # an aggregate always answers one row
        return int(row["left"]), int(row["total"])

    async def data_keys_to_rewrap(self, check_value: str, limit: int) -> list[tuple[str, bytes]]:
        rows = await self._db.pool.fetch(Q["data_keys_to_rewrap"], check_value, limit)
        return [(row["tenant_id"], bytes(row["wrapped_key"])) for row in rows]

    async def rewrap_data_keys(self, rewrapped: list[tuple[str, bytes]], old: str, new: str) -> int:
        status = await self._db.pool.execute(
            Q["rewrap_data_keys"], [t for t, _ in rewrapped], [w for _, w in rewrapped], new, old
        )
        return int(status.split()[-1])

    async def finish_rotation(self, old: str, new: str) -> bool:
        return await self._db.pool.fetchval(Q["finish_rotation"], old, new) is not None
