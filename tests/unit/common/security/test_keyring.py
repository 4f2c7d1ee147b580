"""The keyring (``sundial_common.security.encryption.Keyring``) over the in-memory key store: processes with one
master key share each tenant's data key, a process with another key is refused, and a rotation lets either key
start until it finishes."""

from __future__ import annotations

import asyncio
import os

import pytest
from sundial_common.security.encryption import PAYLOAD, DecryptionError, Keyring, LocalMasterKey, MasterKeyError
from sundial_common.testing import InMemoryKeyStore


def master_key() -> LocalMasterKey:
    return LocalMasterKey(os.urandom(32))


async def test_two_processes_with_one_master_key_share_each_tenants_data_key() -> None:
    store, key = InMemoryKeyStore(), master_key()
    api, worker = Keyring(key, store), Keyring(key, store)
    await api.start()
    await worker.start()
    sealed = (await api.cipher("acme")).seal_json({"token": "s3cret"}, PAYLOAD)
    assert (await worker.cipher("acme")).open_json(sealed, PAYLOAD) == {"token": "s3cret"}
    assert await store.count_data_keys(key.check_value) == (1, 1), "one data key, under the master key"
    globex = (await api.cipher("globex")).seal_json("x", PAYLOAD)
    with pytest.raises(DecryptionError, match="does not open"):
        (await worker.cipher("acme")).open_json(globex, PAYLOAD)  # another tenant's key


async def test_concurrent_first_messages_of_a_tenant_make_one_data_key() -> None:
    store, key = InMemoryKeyStore(), master_key()
    keyring = Keyring(key, store)
    await keyring.start()
    ciphers = await asyncio.gather(*(keyring.cipher("acme") for _ in range(10)))
    assert len({id(c) for c in ciphers}) == 1
    assert await store.count_data_keys(key.check_value) == (1, 1)


async def test_a_process_with_another_master_key_is_refused_at_start() -> None:
    store = InMemoryKeyStore()
    await Keyring(master_key(), store).start()  # the first process records its key
    with pytest.raises(MasterKeyError, match="is not the one that wrapped this database's data keys"):
        await Keyring(master_key(), store).start()


async def test_during_a_rotation_either_key_starts_and_after_it_only_the_new_one() -> None:
    store, old, new = InMemoryKeyStore(), master_key(), master_key()
    before = Keyring(old, store)
    await before.start()
    sealed = (await before.cipher("acme")).seal_json({"n": 1}, PAYLOAD)
    assert await store.begin_rotation(old.check_value, new.check_value)
    await Keyring(old, store).start()
    await Keyring(new, store).start()

    [(tenant, wrapped)] = await store.data_keys_to_rewrap(old.check_value, 10)
    rewrapped = await new.wrap(await old.unwrap(wrapped, tenant), tenant)
    assert await store.rewrap_data_keys([(tenant, rewrapped)], old.check_value, new.check_value) == 1
    assert await store.finish_rotation(old.check_value, new.check_value)

    after = Keyring(new, store)
    await after.start()
    assert (await after.cipher("acme")).open_json(sealed, PAYLOAD) == {"n": 1}, "old values still open"
    with pytest.raises(MasterKeyError):
        await Keyring(old, store).start()
    with pytest.raises(MasterKeyError, match="no data key could be stored"):
        await before.cipher("globex")  # a process still on the old key cannot add a key nobody could unwrap
