"""Standard Webhooks signatures, checked against the specification's reference library (no I/O)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError
from sundial_common.delivery.signing import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    SignatureError,
    new_secret,
    redact,
    secret_key,
    signed_headers,
    verify,
)

BODY = b'{"event":"execution.dead","executionId":"e-1"}'


def test_the_reference_library_accepts_what_sundial_signs() -> None:
    secret = new_secret()
    headers = signed_headers([secret], "msg_1", int(time.time()), BODY)
    assert Webhook(secret).verify(BODY, headers) == {"event": "execution.dead", "executionId": "e-1"}
    # and Sundial's own verification agrees with the reference signature
    reference = Webhook(secret).sign("msg_1", datetime.now(UTC), BODY.decode())
    assert verify([secret], {**headers, SIGNATURE_HEADER: reference}, BODY, time.time()) == "msg_1"


def test_a_tampered_body_fails() -> None:
    secret = new_secret()
    headers = signed_headers([secret], "msg_1", int(time.time()), BODY)
    tampered = BODY.replace(b"e-1", b"e-2")
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(tampered, headers)
    with pytest.raises(SignatureError, match="no signature matches"):
        verify([secret], headers, tampered, time.time())


def test_an_old_timestamp_fails() -> None:
    secret = new_secret()
    old = int(time.time()) - 600
    headers = signed_headers([secret], "msg_1", old, BODY)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(BODY, headers)
    with pytest.raises(SignatureError, match=TIMESTAMP_HEADER):
        verify([secret], headers, BODY, time.time())


def test_during_a_rotation_either_secret_verifies() -> None:
    old, new = new_secret(), new_secret()
    headers = signed_headers([old, new], "msg_2", int(time.time()), BODY)
    assert len(headers[SIGNATURE_HEADER].split(" ")) == 2
    for secret in (old, new):
        Webhook(secret).verify(BODY, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(BODY, headers)


def test_secrets_are_well_formed_and_redacted() -> None:
    secret = new_secret()
    assert secret.startswith("whsec_") and len(secret_key(secret)) == 32
    shown = redact(secret)
    assert shown.endswith(secret[-4:]) and secret_key(secret).hex() not in shown and len(shown) < 16
    with pytest.raises(ValueError, match="base64"):
        secret_key("whsec_not base64!")
    with pytest.raises(ValueError, match="24 to 64 bytes"):
        secret_key("whsec_c2hvcnQ=")
