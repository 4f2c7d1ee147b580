"""The web console's sessions: kept server-side in Redis, named by an opaque cookie, ended by sign-out.

A session is what a bearer token proved at sign-in (tenant, subject, admin claim) plus its CSRF token, kept
until the token's own expiry. The browser holds only a random session id; Redis holds the session under a
SHA-256 of that id, so a reader of Redis cannot replay a key as a cookie. The token itself is not kept.

Redis may lose everything (it is a cache here, as everywhere in Sundial): a lost session only means signing in
again. Sign-out deletes the session, so a copied cookie stops working at once; a session whose tenant is
suspended or deregistered is deleted at its next request (:mod:`sundial_api.console.guard`).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

import orjson
from redis.asyncio import Redis
from sundial_common.security.auth import Principal

#: The cookie that carries the session id. Path=/ui: the browser never sends it to /v1.
COOKIE = "sundial_console"
#: The cookie of the sign-in form's CSRF token (before any session exists: double submit).
SIGN_IN_COOKIE = "sundial_console_signin"
KEY_PREFIX = "sundial:console:session:"


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    """One signed-in browser: who it acts as, until when, and the token its forms must carry."""

    tenant: str
    subject: str
    admin: bool
    expires_at: float
    csrf: str
    #: The signing key that vouched for the token (:mod:`sundial_api.console.signing_keys`); None: none known.
    signing_key: str | None = None

    @property
    def principal(self) -> Principal:
        """The principal the API's own endpoints run as for this session."""
        return Principal(tenant=self.tenant, subject=self.subject, admin=self.admin)


def _key(session_id: str) -> str:
    return KEY_PREFIX + hashlib.sha256(session_id.encode()).hexdigest()


class SessionStore:
    """Console sessions in Redis, each expiring with the token that opened it."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def open(
        self, principal: Principal, expires_at: float, now: float, signing_key: str | None = None
    ) -> tuple[str, ConsoleSession]:
        """A new session for ``principal`` until ``expires_at`` (epoch seconds): its id (for the cookie) and it."""
        session_id = secrets.token_urlsafe(32)
        session = ConsoleSession(
            tenant=principal.tenant,
            subject=principal.subject,
            admin=principal.admin,
            expires_at=expires_at,
            csrf=secrets.token_urlsafe(32),
            signing_key=signing_key,
        )
        value = orjson.dumps(
            {"tenant": session.tenant, "subject": session.subject, "admin": session.admin,
             "expiresAt": session.expires_at, "csrf": session.csrf, "signingKey": session.signing_key}
        )  # fmt: skip
        await self._redis.set(_key(session_id), value, ex=max(1, int(expires_at - now)))
        return session_id, session

    async def get(self, session_id: str, now: float) -> ConsoleSession | None:
        """The live session of this id, or None (unknown, signed out, expired, or lost with Redis)."""
        if not session_id or len(session_id) > 128:
            return None
        raw = await self._redis.get(_key(session_id))
        if raw is None:
            return None
        data = orjson.loads(raw)
        session = ConsoleSession(
            tenant=data["tenant"],
            subject=data["subject"],
            admin=bool(data["admin"]),
            expires_at=float(data["expiresAt"]),
            csrf=data["csrf"],
            signing_key=data.get("signingKey"),
        )
        return session if session.expires_at > now else None

    async def end(self, session_id: str) -> None:
        """Sign-out: the session stops working for every copy of its cookie."""
        await self._redis.delete(_key(session_id))
