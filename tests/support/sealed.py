"""Rows as a user reads them: the values Sundial seals at rest (payload, result, progress, error) opened.

Tests that read executions or attempts straight from a store see ciphertext (that is the point); these
helpers open them with the tests' master key, as the API does for its responses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sundial_common.runtime.settings import EncryptionSettings
from sundial_common.security.encryption import PAYLOAD, PROGRESS, RESULT, Keyring, master_key_provider
from sundial_common.stores import Stores

_JSON_COLUMNS = {"payload": PAYLOAD, "result": RESULT, "progress": PROGRESS, "previous_progress": PROGRESS}


async def opened_all(stores: Stores, rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    plain = [dict(row) for row in rows]
    keyring = Keyring(master_key_provider(EncryptionSettings()), stores.keys)
    await keyring.start()
    ciphers = await keyring.ciphers({row["tenant_id"] for row in plain})
    for row in plain:
        cipher = ciphers[row["tenant_id"]]
        for column, kind in _JSON_COLUMNS.items():
            if column in row:
                row[column] = cipher.open_json(row[column], kind)
        if "error" in row:
            row["error"] = cipher.open_error(row["error"])
    return plain


async def opened(stores: Stores, row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if row is None else (await opened_all(stores, [row]))[0]


async def opened_values(database_url: str, tenant: str, values: Iterable[Any], kind: str) -> list[Any]:
    """``values`` of one column of ``tenant``'s rows (e.g. results read with a plain connection), opened."""
    stores = await Stores.connect(database_url, min_size=1, max_size=1)
    try:
        keyring = Keyring(master_key_provider(EncryptionSettings()), stores.keys)
        await keyring.start()
        cipher = await keyring.cipher(tenant)
        return [cipher.open_json(value, kind) for value in values]
    finally:
        await stores.close()
