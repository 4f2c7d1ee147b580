"""Sealed values: what the stores hold instead of tenants' data, and what opens them (no I/O)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from sundial_common.runtime.settings import EncryptionSettings
from sundial_common.security.encryption import (
    PAYLOAD,
    RESPONSE,
    RESULT,
    DecryptionError,
    MasterKeyError,
    TenantCipher,
    dev_master_key,
    master_key_provider,
    parse_master_key,
)

KEY = bytes(range(32))


def test_sealed_values_hide_the_plaintext_and_open_back() -> None:
    acme = TenantCipher("acme", KEY)
    sealed = acme.seal_json({"token": "s3cret"}, PAYLOAD)
    assert isinstance(sealed, str) and sealed.startswith("sdl1:") and "s3cret" not in sealed
    assert acme.open_json(sealed, PAYLOAD) == {"token": "s3cret"}
    assert acme.seal_json({"token": "s3cret"}, PAYLOAD) != sealed  # a fresh nonce every time
    assert acme.seal_json(None, RESULT) is None
    body = acme.seal_bytes(b'{"payload": "s3cret"}', RESPONSE)
    assert b"s3cret" not in body and acme.open_bytes(body, RESPONSE) == b'{"payload": "s3cret"}'


def test_errors_keep_their_class_readable_and_their_message_sealed() -> None:
    acme = TenantCipher("acme", KEY)
    sealed = acme.seal_error("ValueError: token s3cret refused")
    assert sealed is not None and sealed.startswith("ValueError: sdl1:") and "s3cret" not in sealed
    assert acme.open_error(sealed) == "ValueError: token s3cret refused"
    assert acme.open_error(acme.seal_error("free text, no class")) == "free text, no class"


def test_rows_written_before_encryption_read_as_they_are() -> None:
    acme = TenantCipher("acme", KEY)
    assert acme.open_json({"legacy": 1}, PAYLOAD) == {"legacy": 1}
    assert acme.open_json("a plain string", PAYLOAD) == "a plain string"
    assert acme.open_error("WorkerLost: worker w1 stopped") == "WorkerLost: worker w1 stopped"
    assert acme.open_bytes(b'{"jobId": "x"}', RESPONSE) == b'{"jobId": "x"}'


def test_a_value_moved_to_another_tenant_or_column_or_altered_does_not_open() -> None:
    acme, other = TenantCipher("acme", KEY), TenantCipher("globex", KEY)
    sealed = acme.seal_json({"token": "s3cret"}, PAYLOAD)
    with pytest.raises(DecryptionError):
        other.open_json(sealed, PAYLOAD)  # same key bytes even: the tenant is authenticated data
    with pytest.raises(DecryptionError):
        acme.open_json(sealed, RESULT)
    raw = bytearray(base64.b64decode(sealed[5:]))
    raw[-1] ^= 1
    with pytest.raises(DecryptionError):
        acme.open_json("sdl1:" + base64.b64encode(bytes(raw)).decode(), PAYLOAD)


def test_master_keys_are_32_bytes_and_missing_outside_dev_is_an_error(tmp_path: Path) -> None:
    assert parse_master_key(base64.b64encode(KEY).decode()) == KEY
    assert parse_master_key(KEY.hex()) == KEY
    with pytest.raises(MasterKeyError, match="32 random bytes"):
        parse_master_key(base64.b64encode(b"short").decode())
    with pytest.raises(MasterKeyError, match="SUNDIAL_MASTER_KEY"):
        master_key_provider(EncryptionSettings(env="production", master_key=None, master_key_file=None))
    dev = EncryptionSettings(env="dev", master_key=None, master_key_file=None, dev_root=str(tmp_path))
    first = master_key_provider(dev)
    assert (tmp_path / "master.key").stat().st_mode & 0o077 == 0  # readable by its owner only
    assert master_key_provider(dev).check_value == first.check_value  # generated once, then reused
    assert dev_master_key(tmp_path) == parse_master_key((tmp_path / "master.key").read_text())
