"""Who may call the gateway: a pool token, valid, still in the registry, its pool still admitting its tenant, and
within its request rate.

:class:`Access` turns a bearer token into a :class:`~sundial_common.security.pool_tokens.PoolGrant`, or a
:class:`Refused` with the HTTP status and reason. The JWT is checked first (signature, pool-token audience and type,
expiry: a tenant or admin token is refused here); then the registry: the token's row (not revoked, same pool and
tenant) and the pool's entry (registered, a production pool, admitting the tenant), each cached at most
``gateway_token_cache_sec`` (2 s) — a revocation, or a pool given to another tenant, applies within that time on
every replica. Last, the token's request bucket (Redis, shared by every replica): beyond
``gateway_rate_per_token`` requests a second, 429 with the wait.
"""

from __future__ import annotations

import time

import asyncpg
from sundial_common.hotwindow.rate_limits import TokenBuckets
from sundial_common.security.auth import InvalidToken
from sundial_common.security.pool_tokens import PoolGrant, PoolTokenVerifier
from sundial_common.stores.pool_cache import PoolCache
from sundial_common.stores.pool_tokens import PoolTokenRecord, PoolTokenStore
from sundial_common.stores.read_once_cache import ReadOnceCache


class Refused(Exception):
    """A call refused: its HTTP ``status`` and ``reason`` (and, for 429, how long to wait)."""

    def __init__(self, status: int, reason: str, retry_after_ms: int = 0) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.retry_after_ms = retry_after_ms


class Access:
    """Checks pool tokens: see the module docstring."""

    def __init__(
        self,
        verifier: PoolTokenVerifier,
        tokens: PoolTokenStore,
        pools: PoolCache,
        buckets: TokenBuckets | None,
        *,
        cache_sec: float,
        rate_per_token: float,
    ) -> None:
        self.verifier = verifier
        self.pools = pools
        self.buckets = buckets
        self.rate_per_token = rate_per_token
        self._tokens: ReadOnceCache[str, PoolTokenRecord] = ReadOnceCache(
            tokens.get_token,
            cache_sec,
            time.monotonic,
            keep_on=(OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError),
            what="pool token",
        )

    async def grant(self, authorization: str | None) -> PoolGrant:
        """The grant of the request's ``Authorization`` header, or :class:`Refused`."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Refused(401, "a pool token is required (Authorization: Bearer <pool token>)")
        try:
            grant = self.verifier.verify(token.strip())
        except InvalidToken as exc:
            raise Refused(401, f"invalid pool token: {exc}") from None
        record = await self._tokens.get(grant.token_id)
        if record is None or record.pool != grant.pool or record.tenant != grant.tenant:
            raise Refused(401, f"pool token {grant.token_id} is not registered")
        if record.revoked:
            raise Refused(401, f"pool token {grant.token_id} was revoked")
        pool = await self.pools.get(grant.pool)
        if pool is None or not pool.admits(grant.tenant) or pool.staging:
            pool = await self.pools.recheck(grant.pool)
        if pool is None:
            raise Refused(403, f"pool {grant.pool} is no longer registered")
        if not pool.admits(grant.tenant):
            raise Refused(403, f"pool {grant.pool} no longer admits tenant {grant.tenant}")
        if pool.staging:
            raise Refused(403, f"pool {grant.pool} is a staging pool: the gateway does not serve replays")
        if self.buckets is not None:
            taken = await self.buckets.take(f"gateway:{grant.token_id}", self.rate_per_token)
            if not taken.granted:
                raise Refused(
                    429,
                    f"pool token {grant.token_id} is over its {self.rate_per_token:g} requests a second",
                    taken.retry_after_ms,
                )
        return grant
