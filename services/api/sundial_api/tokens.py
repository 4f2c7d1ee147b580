"""A cache of bearer tokens this process has already verified.

A tenant service sends the same token on every call, and verifying it (base64, JSON and an HMAC, much of
it in pure Python) costs more than the rest of reading a job from a warm pool. One cache per app, because
the result depends on the signing key.
"""

from __future__ import annotations

import base64
from collections import OrderedDict

import orjson
from sundial_common.security.auth import Principal


class VerifiedTokens:
    """Verified tokens with their principal, each kept until its ``exp`` (a bounded LRU).

    The HS256 keys are fixed for the life of the app, so a token that verified once stays valid until it
    expires; a JWKS key the provider withdraws stops verifying new tokens at the next refresh, while tokens
    already verified with it are trusted here until their ``exp`` (as a JWT's holder is, by design). Only tokens
    that verified are ever stored.
    """

    def __init__(self, max_size: int = 4096) -> None:
        self.max_size = max_size
        self._entries: OrderedDict[str, tuple[Principal, float]] = OrderedDict()

    def get(self, token: str, now: float) -> Principal | None:
        entry = self._entries.get(token)
        if entry is None:
            return None
        principal, expires = entry
        if now >= expires:
            del self._entries[token]
            return None
        self._entries.move_to_end(token)
        return principal

    def put(self, token: str, principal: Principal) -> None:
        self._entries[token] = (principal, expiry_of(token))
        if len(self._entries) > self.max_size:
            self._entries.popitem(last=False)


def expiry_of(token: str) -> float:
    """The ``exp`` (epoch seconds) of a token that verified: its payload is JSON with a numeric ``exp`` (required)."""
    payload = token.split(".")[1]
    return float(orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["exp"])
