"""Envelope encryption of tenants' data at rest: master key providers, per-tenant data keys, sealed values.

Payloads often carry secrets (API tokens, tenant ids), and Postgres and Kafka keep them: backups, replicas
and retained topics are copies outside the processes that need the plaintext. So each tenant gets one random
AES-256 **data key**; the data key is stored only *wrapped* (encrypted) by a **master key** that never
reaches the database (``tenant_data_keys``, :mod:`sundial_common.stores.keys`); values are sealed with
AES-256-GCM under their tenant's data key:

- job payloads (``jobs.payload``), sealed once by the API; the dispatcher, hydrator, sweeper and replayer
  copy the sealed payload into Kafka messages as it is (they hold no key at all), and only workers open it;
- executions' results, attempts' progress checkpoints, handler error details, tracebacks and log tails (sealed
  by the worker that produced them, opened by the API for its responses and by the next attempt);
- the responses kept for Idempotency-Key replays (``idempotency_keys.body``).

**Format.** A sealed JSON value is a JSON *string* ``"sdl1:<base64>"`` (so the jsonb columns keep their type);
a sealed error is ``"<ErrorClass>: sdl1:<base64>"`` (the class alone stays readable: analytics counts error
classes, and a class name is no secret); sealed bytes are ``b"\\x00sdl1" + nonce + ciphertext``. The base64
(or bytes after the magic) is a 12-byte random nonce followed by the GCM ciphertext and tag, with the tenant
and the kind of value (``payload``, ``result``…) as associated data: a sealed value moved to another tenant's
row or another column fails to open instead of being read as someone else's. **Rows written before
encryption** carry no prefix and are read as they are (plaintext): nothing is lost on upgrade, and each row is
sealed the next time it is written (new jobs, results and responses are always sealed).

**Master key.** A :class:`KeyProvider` wraps and unwraps data keys; :class:`LocalMasterKey` does it with a
32-byte key from ``SUNDIAL_MASTER_KEY`` / ``SUNDIAL_MASTER_KEY_FILE`` (a KMS would implement the same three
methods). Each provider has a *check value* (a keyed hash of the key, safe to store); the database records the
check value of the master key that wraps its data keys, and :meth:`Keyring.start` refuses to start a process
whose key is another one (:class:`MasterKeyError`) — a wrong or lost key is never discovered later as
unreadable rows. With ``SUNDIAL_ENV=dev`` and no key configured, a key is generated once under the dev root
(``.sundial/master.key``); anywhere else a missing key stops the process at start with a message saying how
to set one. ``sundial keys rotate`` (:mod:`sundial_common.commands.keys`) re-wraps every data key under a new
master key; data keys themselves do not change, so everything sealed before still opens.

**Cost.** Unwrapped data keys are cached in the process (:class:`Keyring`): one query per tenant per process
lifetime, none per message; AES-GCM itself is a few microseconds per value.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from sundial_common.runtime.settings import EncryptionSettings

KEY_BYTES = 32
NONCE_BYTES = 12
TEXT_PREFIX = "sdl1:"
BYTES_PREFIX = b"\x00sdl1"
DEV_KEY_FILE = "master.key"

PAYLOAD = "payload"
RESULT = "result"
PROGRESS = "progress"
ERROR = "error"
TRACEBACK = "traceback"
LOG_TAIL = "log_tail"
RESPONSE = "response"

_ERROR_CLASS = re.compile(r"^([A-Za-z_][\w.]{0,99})(?::|$)")
_SEALED_ERROR = re.compile(r"^([A-Za-z_][\w.]{0,99}): (" + re.escape(TEXT_PREFIX) + r"[A-Za-z0-9+/=]+)$")


class MasterKeyError(RuntimeError):
    """The master key is missing, malformed, or not the one that wrapped the stored data keys."""


class DecryptionError(RuntimeError):
    """A sealed value did not open (tampered, moved to another row, or a data key that is not its own)."""


class KeyProvider(Protocol):
    """Wraps and unwraps data keys under a master key held outside the database (a local key, a KMS)."""

    @property
    def check_value(self) -> str:
        """A public fingerprint of the master key, stored to recognise it (never enough to recover it)."""
        ...

    async def wrap(self, data_key: bytes, tenant_id: str) -> bytes: ...

    async def unwrap(self, wrapped: bytes, tenant_id: str) -> bytes: ...


def parse_master_key(text: str) -> bytes:
    """32 bytes from base64 (standard or url-safe) or 64 hex digits; anything else is refused."""
    value = text.strip()
    raw: bytes | None = None
    if re.fullmatch(r"[0-9a-fA-F]{64}", value):
        raw = bytes.fromhex(value)
    else:
        try:
            raw = base64.b64decode(value.replace("-", "+").replace("_", "/") + "=" * (-len(value) % 4), validate=True)
        except (binascii.Error, ValueError):
            raw = None
    if raw is None or len(raw) != KEY_BYTES:
        got = "not base64 or hex" if raw is None else f"{len(raw)} bytes"
        raise MasterKeyError(f"the master key must be {KEY_BYTES} random bytes as base64 or 64 hex digits ({got})")
    return raw


class LocalMasterKey:
    """:class:`KeyProvider` over a 32-byte key held by the process (wrapping is AES-256-GCM, AAD = tenant)."""

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise MasterKeyError(f"the master key must be {KEY_BYTES} bytes, not {len(key)}")
        self._aead = AESGCM(key)
        self._check_value = hmac.new(key, b"sundial master key check value", hashlib.sha256).hexdigest()[:16]

    @property
    def check_value(self) -> str:
        return self._check_value

    async def wrap(self, data_key: bytes, tenant_id: str) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, data_key, _wrap_aad(tenant_id))

    async def unwrap(self, wrapped: bytes, tenant_id: str) -> bytes:
        try:
            return self._aead.decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], _wrap_aad(tenant_id))
        except InvalidTag:
            raise MasterKeyError(f"the data key of tenant {tenant_id!r} does not unwrap with this master key") from None


def _wrap_aad(tenant_id: str) -> bytes:
    return b"sundial data key\x00" + tenant_id.encode()


def master_key_provider(settings: EncryptionSettings) -> LocalMasterKey:
    """The provider the settings name; a missing key outside ``SUNDIAL_ENV=dev`` raises :class:`MasterKeyError`."""
    if settings.master_key:
        return LocalMasterKey(parse_master_key(settings.master_key))
    if settings.master_key_file:
        path = Path(settings.master_key_file)
        try:
            return LocalMasterKey(parse_master_key(path.read_text()))
        except OSError as exc:
            raise MasterKeyError(f"cannot read SUNDIAL_MASTER_KEY_FILE {path}: {exc.strerror}") from None
    if settings.env != "dev":
        raise MasterKeyError(
            "no master key: set SUNDIAL_MASTER_KEY (32 random bytes as base64, e.g. `openssl rand -base64 32`) or "
            "SUNDIAL_MASTER_KEY_FILE. On a developer machine, start the stack (`make up` in the checkout): a process "
            "started anywhere then uses its development key."
        )
    return LocalMasterKey(dev_master_key(Path(settings.dev_root)))


def dev_master_key(root: Path) -> bytes:
    """The development master key under ``root``, generated on first use (owner-readable only).

    ``root`` must exist (the dev stack creates it): a process started elsewhere, whose relative default
    (``.sundial``) names a directory of its working directory, must not leave key material there — nor
    generate a key that cannot open the stack's data.
    """
    path = root / DEV_KEY_FILE
    if not root.is_dir():
        raise MasterKeyError(
            f"no development stack state at SUNDIAL_DEV_ROOT={root} ({root.resolve()} does not exist): start the "
            "stack (`make up` in the checkout; a process started anywhere then finds it), or set SUNDIAL_DEV_ROOT "
            "to its state directory (<checkout>/.sundial), or SUNDIAL_MASTER_KEY outside development"
        )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return parse_master_key(path.read_text())
    with os.fdopen(fd, "w") as out:  # O_EXCL: two processes starting together agree on one key
        out.write(base64.b64encode(os.urandom(KEY_BYTES)).decode() + "\n")
    return parse_master_key(path.read_text())


class TenantCipher:
    """Seals and opens one tenant's values with its (unwrapped) data key. Synchronous: the key is in hand."""

    __slots__ = ("_aead", "_tenant")

    def __init__(self, tenant_id: str, data_key: bytes) -> None:
        self._tenant = tenant_id.encode()
        self._aead = AESGCM(data_key)

    def _seal(self, plaintext: bytes, kind: str) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, plaintext, self._tenant + b"\x00" + kind.encode())

    def _open(self, sealed: bytes, kind: str) -> bytes:
        try:
            return self._aead.decrypt(
                sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], self._tenant + b"\x00" + kind.encode()
            )
        except InvalidTag:
            raise DecryptionError(f"a sealed {kind} of tenant {self._tenant.decode()!r} does not open") from None

    def seal_json(self, value: Any, kind: str) -> Any:
        """``value`` as a sealed JSON string; None stays None (nothing to hide, and NULL keeps its meaning)."""
        if value is None:
            return None
        return TEXT_PREFIX + base64.b64encode(self._seal(orjson.dumps(value), kind)).decode()

    def open_json(self, value: Any, kind: str) -> Any:
        """The value :meth:`seal_json` sealed; anything unsealed (a row written before encryption) as it is."""
        if isinstance(value, str) and value.startswith(TEXT_PREFIX):
            return orjson.loads(self._open(base64.b64decode(value[len(TEXT_PREFIX) :]), kind))
        return value

    def seal_error(self, error: str | None) -> str | None:
        """``"ValueError: sdl1:…"``: the class readable (analytics counts classes), the message sealed."""
        if error is None:
            return None
        match = _ERROR_CLASS.match(error)
        prefix = match.group(1) if match else "Error"
        return f"{prefix}: {TEXT_PREFIX}{base64.b64encode(self._seal(error.encode(), ERROR)).decode()}"

    def open_error(self, error: str | None) -> str | None:
        if error is None:
            return None
        match = _SEALED_ERROR.match(error)
        if match is None:
            return error  # written before encryption, or by Sundial itself ("worker lost"): no tenant data
        return self._open(base64.b64decode(match.group(2)[len(TEXT_PREFIX) :]), ERROR).decode()

    def seal_bytes(self, data: bytes, kind: str) -> bytes:
        return BYTES_PREFIX + self._seal(data, kind)

    def open_bytes(self, data: bytes, kind: str) -> bytes:
        if data.startswith(BYTES_PREFIX):
            return self._open(data[len(BYTES_PREFIX) :], kind)
        return data


class DataKeyStore(Protocol):
    """Where wrapped data keys and the master key's check value live (:mod:`sundial_common.stores.keys`)."""

    async def master_check_values(self) -> tuple[str | None, str | None]: ...

    async def record_master_check_value(self, check_value: str) -> None: ...

    async def wrapped_data_keys(self, tenants: list[str]) -> dict[str, tuple[bytes, str]]: ...

    async def add_data_key(self, tenant_id: str, wrapped: bytes, check_value: str) -> bool: ...


class Keyring:
    """The process's unwrapped data keys, by tenant: one database read per tenant per process lifetime."""

    def __init__(self, provider: KeyProvider, store: DataKeyStore) -> None:
        self.provider = provider
        self._store = store
        self._ciphers: dict[str, TenantCipher] = {}
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Check the master key against the database's record of it; the first process records it.

        Raises :class:`MasterKeyError` when the database's data keys are wrapped by another master key
        (during a rotation, either the old or the new key is accepted).
        """
        current, rotating_to = await self._store.master_check_values()
        if current is None:
            await self._store.record_master_check_value(self.provider.check_value)
            current, rotating_to = await self._store.master_check_values()
        if self.provider.check_value not in (current, rotating_to):
            raise MasterKeyError(
                f"the master key (check value {self.provider.check_value}) is not the one that wrapped this "
                f"database's data keys (check value {current}): refusing to start rather than fail to read "
                "tenants' data. Set SUNDIAL_MASTER_KEY / SUNDIAL_MASTER_KEY_FILE to that key "
                "(`sundial keys check` shows both)."
            )

    def cached(self, tenant_id: str) -> TenantCipher | None:
        return self._ciphers.get(tenant_id)

    async def cipher(self, tenant_id: str) -> TenantCipher:
        cipher = self._ciphers.get(tenant_id)
        if cipher is None:
            cipher = (await self.ciphers((tenant_id,)))[tenant_id]
        return cipher

    async def ciphers(self, tenants: Iterable[str]) -> dict[str, TenantCipher]:
        """The ciphers of ``tenants``: the missing ones in one read (and one insert for brand-new tenants)."""
        wanted = set(tenants)
        missing = [t for t in wanted if t not in self._ciphers]
        if missing:
            async with self._lock:  # concurrent first messages of one tenant: one read, one new key
                missing = [t for t in missing if t not in self._ciphers]
                if missing:
                    await self._load(missing)
        return {t: self._ciphers[t] for t in wanted}

    async def _load(self, tenants: list[str]) -> None:
        found = await self._store.wrapped_data_keys(tenants)
        for tenant in tenants:
            if tenant not in found:
                wrapped = await self.provider.wrap(AESGCM.generate_key(bit_length=256), tenant)
                await self._store.add_data_key(tenant, wrapped, self.provider.check_value)
        if len(found) < len(tenants):
            found = await self._store.wrapped_data_keys(tenants)  # another process may have won the insert
        for tenant in tenants:
            if tenant not in found:
                raise MasterKeyError(
                    f"no data key could be stored for tenant {tenant!r}: the database's master key changed "
                    "(a rotation finished?); restart this process with the new SUNDIAL_MASTER_KEY"
                )
            wrapped, check_value = found[tenant]
            if check_value != self.provider.check_value:
                raise MasterKeyError(
                    f"the data key of tenant {tenant!r} is wrapped by master key {check_value}, this process has "
                    f"{self.provider.check_value}: restart it with the current SUNDIAL_MASTER_KEY"
                )
            self._ciphers[tenant] = TenantCipher(tenant, await self.provider.unwrap(wrapped, tenant))


async def open_keyring(settings: EncryptionSettings, store: DataKeyStore) -> Keyring:
    """The process's keyring, checked against the database (raises :class:`MasterKeyError` at start)."""
    keyring = Keyring(master_key_provider(settings), store)
    await keyring.start()
    return keyring
