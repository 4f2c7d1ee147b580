"""The keyring against Postgres: the master key is checked at start, rotation re-wraps data keys, and what was
sealed before a rotation opens after it."""

from __future__ import annotations

import base64
import os

import pytest
from sundial_api.app import create_app
from sundial_api.settings import ApiSettings
from sundial_common.commands.keys import rotate
from sundial_common.security.encryption import PAYLOAD, Keyring, LocalMasterKey, MasterKeyError
from sundial_common.stores import Stores


def _key() -> LocalMasterKey:
    return LocalMasterKey(os.urandom(32))


async def test_a_wrong_master_key_is_refused_at_start(database_url: str, redis_url: str) -> None:
    right = base64.b64encode(os.urandom(32)).decode()
    app = create_app(ApiSettings(database_url=database_url, redis_url=redis_url, master_key=right))
    async with app.router.lifespan_context(app):
        pass  # the first process records its key's check value
    wrong = create_app(
        ApiSettings(
            database_url=database_url, redis_url=redis_url, master_key=base64.b64encode(os.urandom(32)).decode()
        )
    )
    with pytest.raises(MasterKeyError, match="is not the one that wrapped this database's data keys"):
        async with wrong.router.lifespan_context(wrong):
            pass
    missing = create_app(
        ApiSettings(
            database_url=database_url,
            redis_url=redis_url,
            master_key=None,
            env="production",
            jwt_secret="a-production-signing-key-of-at-least-32-bytes",
        )
    )
    with pytest.raises(MasterKeyError, match="no master key: set SUNDIAL_MASTER_KEY"):
        async with missing.router.lifespan_context(missing):
            pass


async def test_rotation_rewraps_every_data_key_and_old_values_still_open(database_url: str) -> None:
    stores = await Stores.connect(database_url, min_size=1, max_size=2)
    try:
        old, new = _key(), _key()
        before = Keyring(old, stores.keys)
        await before.start()
        ciphers = await before.ciphers([f"t{i}" for i in range(7)])
        sealed = {tenant: cipher.seal_json({"tenant": tenant}, PAYLOAD) for tenant, cipher in ciphers.items()}

        assert await rotate(database_url, old, new, batch=3, quiet=True) == 0
        after = Keyring(new, stores.keys)
        await after.start()
        opened = {t: (await after.cipher(t)).open_json(value, PAYLOAD) for t, value in sealed.items()}
        assert opened == {tenant: {"tenant": tenant} for tenant in sealed}
        assert await stores.keys.count_data_keys(old.check_value) == (0, 7)
        with pytest.raises(MasterKeyError):
            await Keyring(old, stores.keys).start()  # the old key is refused from now on
        assert await rotate(database_url, old, new) == 0  # a re-run after success: nothing to do
        with pytest.raises(MasterKeyError, match="cannot rotate"):
            await rotate(database_url, old, _key())  # from a key that is no longer the database's
    finally:
        await stores.close()
