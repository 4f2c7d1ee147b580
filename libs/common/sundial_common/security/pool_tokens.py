"""Pool tokens and attempt tokens: the only credentials a worker behind the worker gateway holds.

A **pool token** is a JWT of its own kind: audience :data:`POOL_AUDIENCE` (never the API's) and ``typ`` ``pool``,
so the API refuses it and the gateway refuses tenant and admin tokens. Its claims name the ``pool``, the one
``tenant`` whose work it may take (an owned pool's owner, or one of a shared pool's tenants) and ``jti``, the id of
its row in the registry (``pool_tokens``), which the gateway checks on use so that a revoked token stops working
within the registry cache's time. It is signed with the same HS256 keys as tenant tokens (the newest signs, a
``kid`` picks the key), and is short-lived: the gateway's refresh endpoint issues a new one with the same ``jti``.

An **attempt token** proves that a worker holds one attempt of one execution, started for one worker session: an
HMAC-SHA256 over the three, under a key derived from the signing key (so any gateway replica can check what
another issued), compared in constant time. It is unguessable without the key, and useless for another attempt
(a retry), another execution or another session.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jwt

from sundial_common.security.auth import ISSUER, InvalidToken, MalformedToken, SymmetricKey

#: The audience of every pool token: not the API's (``SUNDIAL_JWT_AUDIENCE``), so the API refuses them.
POOL_AUDIENCE = "sundial-worker"
#: The ``typ`` claim that marks a pool token (a tenant token carries none).
POOL_TOKEN_TYPE = "pool"
#: Lifetime of a pool token when its creator names none: an hour, refreshed by the worker before it ends.
DEFAULT_TTL_SEC = 3600
MAX_TTL_SEC = 30 * 24 * 3600


@dataclass(frozen=True, slots=True)
class PoolGrant:
    """What a verified pool token lets its holder do: take ``tenant``'s work from ``pool``."""

    token_id: str
    pool: str
    tenant: str
    subject: str
    expires_at: int
    ttl_sec: int


def issue_pool_token(
    key: SymmetricKey, *, token_id: str, pool: str, tenant: str, subject: str, ttl_sec: int, now: float | None = None
) -> str:
    """A pool token for ``tenant``'s work in ``pool``, registered as ``token_id``, valid ``ttl_sec`` seconds."""
    issued = int(time.time() if now is None else now)
    claims: dict[str, Any] = {
        "iss": ISSUER,
        "aud": POOL_AUDIENCE,
        "typ": POOL_TOKEN_TYPE,
        "sub": subject,
        "jti": token_id,
        "pool": pool,
        "tenant": tenant,
        "ttl": ttl_sec,
        "iat": issued,
        "exp": issued + ttl_sec,
    }
    return jwt.encode(claims, key.secret, algorithm="HS256", headers={"kid": key.kid} if key.kid else None)


class PoolTokenVerifier:
    """Checks a pool token's signature, audience, type, issuer and expiry (not the registry: the gateway does)."""

    def __init__(self, keys: Sequence[SymmetricKey], *, leeway_sec: float = 30.0) -> None:
        self.keys = tuple(keys)
        self.leeway_sec = leeway_sec

    def verify(self, token: str) -> PoolGrant:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise MalformedToken from exc
        if header.get("alg") != "HS256":
            raise InvalidToken("not a pool token (pool tokens are HS256, minted by `sundial pools token create`)")
        kid = header.get("kid")
        candidates = [key.secret for key in self.keys if kid is None or key.kid == kid]
        if not candidates:
            raise InvalidToken(f"unknown key id {kid!r}" if kid is not None else "no HS256 key is configured")
        claims = self._decode(token, candidates)
        if claims.get("typ") != POOL_TOKEN_TYPE:
            raise InvalidToken("not a pool token (a tenant or admin token is for the API, not the worker gateway)")
        fields = {name: claims.get(name) for name in ("jti", "pool", "tenant")}
        for name, value in fields.items():
            if not isinstance(value, str) or not value:
                raise InvalidToken(f"pool token names no `{name}`")
        ttl = claims.get("ttl")
        return PoolGrant(
            token_id=str(fields["jti"]),
            pool=str(fields["pool"]),
            tenant=str(fields["tenant"]),
            subject=str(claims["sub"]),
            expires_at=int(claims["exp"]),
            ttl_sec=ttl if isinstance(ttl, int) and 0 < ttl <= MAX_TTL_SEC else DEFAULT_TTL_SEC,
        )

    def _decode(self, token: str, secrets: list[str]) -> dict[str, Any]:
        failure: jwt.PyJWTError | None = None
        for secret in secrets:
            try:
                claims: dict[str, Any] = jwt.decode(
                    token,
                    secret,
                    algorithms=["HS256"],
                    audience=POOL_AUDIENCE,
                    issuer=ISSUER,
                    leeway=self.leeway_sec,
                    options={"require": ["exp", "iss", "sub", "aud"]},
                )
                return claims
            except jwt.InvalidSignatureError as exc:  # maybe another key of a kid-less token
                failure = exc
            except jwt.InvalidAudienceError as exc:
                raise InvalidToken(
                    "not a pool token (a tenant or admin token is for the API, not the worker gateway)"
                ) from exc
            except jwt.DecodeError as exc:
                raise MalformedToken from exc
            except jwt.PyJWTError as exc:
                raise InvalidToken(str(exc)) from exc
        raise InvalidToken(str(failure))


def _attempt_key(key: SymmetricKey) -> bytes:
    # A key of its own, derived from the signing key: an attempt token is never a valid JWT signature or the reverse.
    return hmac.new(key.secret.encode(), b"sundial attempt token v1", hashlib.sha256).digest()


def attempt_token(key: SymmetricKey, execution_id: str, attempt: int, session: str) -> str:
    """The attempt token of ``execution_id``'s attempt ``attempt`` started for worker session ``session``."""
    message = f"{execution_id}\x00{attempt}\x00{session}".encode()
    digest = hmac.new(_attempt_key(key), message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def attempt_token_valid(
    keys: Sequence[SymmetricKey], token: str, execution_id: str, attempt: int, session: str
) -> bool:
    """Whether ``token`` is the attempt token of exactly this execution, attempt and session (under any key, so a
    rotation does not strand running attempts), compared in constant time."""
    valid = False
    for key in keys:
        # Every key is tried, whatever an earlier one answered: the time taken says nothing about the token.
        valid |= hmac.compare_digest(attempt_token(key, execution_id, attempt, session), token)
    return valid
