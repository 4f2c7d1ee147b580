"""Token buckets in Redis: per-tenant rate quotas shared by every API replica and every shard leader.

One bucket is a hash ``{tokens, at}`` refilled at ``rate`` per second up to ``burst``; a take is one Lua
call that refills, grants what it can (up to ``want``) and says how long until the next token. The clock is
Redis' own ``TIME``, so replicas on machines whose clocks disagree share one bucket correctly. Redis may
lose a bucket at any moment (it is a cache, DESIGN invariant 1): the bucket then starts full again, which
lets one burst through and nothing worse.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

_TAKE = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate / 1000)
local granted = math.min(want, math.floor(tokens))
tokens = tokens - granted
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
local wait = 0
if granted < want then wait = math.ceil((1 - (tokens - math.floor(tokens))) * 1000 / rate) end
return {granted, wait}
"""


@dataclass(frozen=True, slots=True)
class Grant:
    #: Tokens taken (0..want).
    granted: int
    #: Milliseconds until the next token, when fewer than ``want`` were granted (else 0).
    retry_after_ms: int


class TokenBuckets:
    """Named token buckets over one Redis connection pool."""

    def __init__(self, redis: Redis, prefix: str = "sundial:bucket") -> None:
        self.redis = redis
        self.prefix = prefix
        self._take = redis.register_script(_TAKE)

    async def take(self, name: str, rate: float, want: int = 1, burst: float | None = None) -> Grant:
        """Take up to ``want`` tokens from bucket ``name`` (``rate`` per second, ``burst`` default one second's)."""
        capacity = max(1.0, rate if burst is None else burst)
        granted, wait = await self._take(keys=[f"{self.prefix}:{name}"], args=[repr(rate), repr(capacity), want])
        return Grant(int(granted), int(wait))
