"""InMemoryKeyStore: tenants' wrapped data keys and the master key record in memory, for tests of the keyring
and of key rotation."""

from __future__ import annotations


class InMemoryKeyStore:
    """:class:`~sundial_common.stores.keys.KeyStore` in memory, with the Postgres store's rules: a data key is added
    only under the recorded master key (or the one a rotation moves to), once per tenant; a rotation finishes only
    once no data key is left under the old key."""

    def __init__(self) -> None:
        self._key_check: str | None = None
        self._rotating_to: str | None = None
        #: tenant → (wrapped key, check value of the master key that wrapped it)
        self._data_keys: dict[str, tuple[bytes, str]] = {}

    async def master_check_values(self) -> tuple[str | None, str | None]:
        return self._key_check, self._rotating_to

    async def record_master_check_value(self, check_value: str) -> None:
        """The first call records it; later ones change nothing."""
        if self._key_check is None:
            self._key_check = check_value

    async def wrapped_data_keys(self, tenants: list[str]) -> dict[str, tuple[bytes, str]]:
        return {t: self._data_keys[t] for t in tenants if t in self._data_keys}

    async def add_data_key(self, tenant_id: str, wrapped: bytes, check_value: str) -> bool:
        known = self._key_check is not None and check_value in (self._key_check, self._rotating_to)
        if not known or tenant_id in self._data_keys:
            return False
        self._data_keys[tenant_id] = (bytes(wrapped), check_value)
        return True

    async def begin_rotation(self, old: str, new: str) -> bool:
        """From ``old`` to ``new``; resuming a rotation already going to ``new`` is fine, another target is not."""
        if self._key_check != old or self._rotating_to not in (None, new):
            return False
        self._rotating_to = new
        return True

    async def count_data_keys(self, check_value: str) -> tuple[int, int]:
        """(keys still under ``check_value``, every key)."""
        left = sum(1 for _, check in self._data_keys.values() if check == check_value)
        return left, len(self._data_keys)

    async def data_keys_to_rewrap(self, check_value: str, limit: int) -> list[tuple[str, bytes]]:
        under = sorted((t, w) for t, (w, check) in self._data_keys.items() if check == check_value)
        return under[:limit]

    async def rewrap_data_keys(self, rewrapped: list[tuple[str, bytes]], old: str, new: str) -> int:
        """Compare-and-set on the old check value: a key re-wrapped meanwhile is left alone. How many changed."""
        changed = 0
        for tenant_id, wrapped in rewrapped:
            current = self._data_keys.get(tenant_id)
            if current is not None and current[1] == old:
                self._data_keys[tenant_id] = (bytes(wrapped), new)
                changed += 1
        return changed

    async def finish_rotation(self, old: str, new: str) -> bool:
        """Only once no data key is left under ``old``."""
        if self._key_check != old or self._rotating_to != new:
            return False
        if any(check == old for _, check in self._data_keys.values()):
            return False
        self._key_check, self._rotating_to = new, None
        return True
