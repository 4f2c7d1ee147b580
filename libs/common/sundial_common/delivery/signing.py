"""Standard Webhooks signing: how a receiver knows a request came from Sundial, unchanged and recent.

Each request carries ``webhook-id`` (stable across retries of one message, so receivers deduplicate),
``webhook-timestamp`` (Unix seconds) and ``webhook-signature``: ``v1,<base64 HMAC-SHA256>`` over
``"{id}.{timestamp}.{body}"`` keyed by the destination's secret. A secret is ``whsec_`` followed by the base64
of 32 random bytes. While a secret is rotated the destination has two, and the header carries one signature
per secret (space-separated): a receiver that knows either accepts the request.

A secret is shown once, when it is made; Sundial stores it sealed under the tenant's data key and
:func:`redact` is what logs, traces and delivery logs show instead of it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Mapping, Sequence

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
#: A receiver refuses a timestamp further than this from its clock (the specification's suggestion).
DEFAULT_TOLERANCE_SEC = 300
ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"


class SignatureError(ValueError):
    """A request's signature headers are missing, malformed, stale, or match none of the secrets."""


def new_secret() -> str:
    """A fresh destination secret (``whsec_`` + base64 of 32 random bytes)."""
    return SECRET_PREFIX + base64.b64encode(os.urandom(SECRET_BYTES)).decode()


def secret_key(secret: str) -> bytes:
    """The HMAC key of ``secret``; a malformed secret raises :class:`ValueError` saying what is expected."""
    text = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"a webhook secret is {SECRET_PREFIX!r} followed by base64") from None
    if not 24 <= len(key) <= 64:
        raise ValueError(f"a webhook secret's key is 24 to 64 bytes, not {len(key)}")
    return key


def redact(secret: str | None) -> str:
    """What may be shown of a secret once it is stored: its prefix and last four characters."""
    if not secret:
        return ""
    return f"{SECRET_PREFIX}…{secret[-4:]}"


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64>``: the signature of one message under one secret."""
    content = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(secret_key(secret), content, hashlib.sha256).digest()).decode()


def signed_headers(secrets: Sequence[str], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers, with one signature per current secret."""
    if not secrets:
        raise ValueError("a signed request needs at least one secret")
    return {
        ID_HEADER: msg_id,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: " ".join(signature(s, msg_id, timestamp, body) for s in secrets),
    }


def verify(
    secrets: Sequence[str],
    headers: Mapping[str, str],
    body: bytes,
    now: float,
    tolerance_sec: float = DEFAULT_TOLERANCE_SEC,
) -> str:
    """The message id when ``headers`` sign ``body`` under one of ``secrets`` within the tolerance.

    Comparisons are constant-time (:func:`hmac.compare_digest`): a receiver must not leak how much of a
    forged signature was right. Raises :class:`SignatureError` saying which check failed.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    msg_id = lowered.get(ID_HEADER)
    stamp = lowered.get(TIMESTAMP_HEADER)
    signatures = lowered.get(SIGNATURE_HEADER)
    if not msg_id or not stamp or not signatures:
        raise SignatureError(f"missing one of {ID_HEADER}, {TIMESTAMP_HEADER}, {SIGNATURE_HEADER}")
    try:
        timestamp = int(stamp)
    except ValueError:
        raise SignatureError(f"{TIMESTAMP_HEADER} is not Unix seconds: {stamp!r}") from None
    if abs(now - timestamp) > tolerance_sec:
        raise SignatureError(f"{TIMESTAMP_HEADER} is more than {tolerance_sec:g} s from now")
    offered = [part for part in signatures.split(" ") if part.startswith("v1,")]
    for secret in secrets:
        expected = signature(secret, msg_id, timestamp, body)
        if any(hmac.compare_digest(expected.encode(), candidate.encode()) for candidate in offered):
            return msg_id
    raise SignatureError("no signature matches the secret")
