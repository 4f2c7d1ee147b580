"""Which signing key a console session rests on, so that rotating the key out ends the session.

A session outlives the request that opened it, so it must not outlive the key that vouched for its token: at
sign-in the console notes the key (an HS256 secret, by a digest of it, never the secret; or a JWKS key by its
id), and each request checks that the API still trusts that key. Once an operator drops it (a new
``SUNDIAL_JWT_KEYS`` without it, or a JWKS without that ``kid``), every session it opened is ended.
"""

from __future__ import annotations

import hashlib

import jwt
from sundial_common.security.auth import TokenVerifier


def _digest(secret: str) -> str:
    return "hs256:" + hashlib.sha256(secret.encode()).hexdigest()


def key_of(token: str, verifier: TokenVerifier) -> str | None:
    """The key that verified ``token`` (a token that has just verified), or None if it cannot be told apart."""
    header = jwt.get_unverified_header(token)
    kid = header.get("kid")
    if header.get("alg") == "HS256":
        secrets = [key.secret for key in verifier.keys if kid is None or key.kid == kid]
        return _digest(secrets[0]) if len(secrets) == 1 else None
    return f"jwks:{kid}" if isinstance(kid, str) else None


async def still_trusted(key: str | None, verifier: TokenVerifier) -> bool:
    """The API still verifies tokens with ``key`` (a session opened without a known key: always)."""
    if key is None:
        return True
    if key.startswith("hs256:"):
        return any(_digest(k.secret) == key for k in verifier.keys)
    if key.startswith("jwks:") and verifier.jwks is not None:
        return await verifier.jwks.key(key.removeprefix("jwks:")) is not None
    return False
