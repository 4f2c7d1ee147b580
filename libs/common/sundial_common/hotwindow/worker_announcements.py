"""Worker announcements: which workers are alive in which pool, with their handlers and free slots.

Each worker process announces itself every heartbeat interval: its pool, the handler names it serves, its
concurrency and free slots (concurrency minus the handlers running), the SDK version, host, pid and start time.
One Redis round trip per interval per worker, whatever it runs — never one per execution:

- ``sundial:workers:<pool>`` — a hash, worker id → ``<expires at, epoch ms> <announcement as JSON>``;
- ``sundial:worker-pools`` — a sorted set of the pools announced, scored by their latest expiry.

An announcement lives ``ttl`` past its write, by **Redis's clock** (the scripts read ``TIME``), so machines whose
clocks disagree still agree on who is alive. A worker that stops gracefully withdraws at once; one that dies
drops out one TTL later; readers delete what expired as they read. Redis may lose everything (DESIGN invariant
1): within one interval every live worker has announced itself again. Both keys of a call may be on different
Redis Cluster slots; Sundial runs one Redis (or a proxy) for them, as for the liveness keys.

:class:`WorkerAnnouncements` is the one public API over them — the API's pool view and handler warnings, the
sweeper's ``sundial_pool_live_workers`` gauge, and later the dispatcher's per-pool bound and a console read
only through it; :class:`LiveWorkersCache` keeps a pool's reading for a moment, for hot paths (a job create).
The condition "a pool has work and no live worker" is defined once, beside the backlog it needs, in
:mod:`sundial_common.coordination.pool_service`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import orjson
from redis.asyncio import Redis

__all__ = ["LiveWorkersCache", "WorkerAnnouncement", "WorkerAnnouncements"]

POOLS_KEY = "sundial:worker-pools"
POOL_KEY_PREFIX = "sundial:workers:"

# KEYS: the pool's hash, the pools' set. ARGV: worker id, announcement (JSON), ttl (ms), pool.
_ANNOUNCE = """
local t = redis.call('TIME')
local expires = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], expires .. ' ' .. ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 10)
redis.call('ZADD', KEYS[2], expires, ARGV[4])
return expires
"""
# KEYS: the pools' set. ARGV: the key prefix of a pool's hash, then the pools to read (none: every pool announced).
# Returns [pool, announcement, expires, pool, announcement, expires, …] of the live ones; deletes what expired.
_LIVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local pools = {}
if #ARGV > 1 then
  for i = 2, #ARGV do pools[#pools + 1] = ARGV[i] end
else
  pools = redis.call('ZRANGE', KEYS[1], 0, -1)
end
local out = {}
for _, pool in ipairs(pools) do
  local key = ARGV[1] .. pool
  local entries = redis.call('HGETALL', key)
  for i = 1, #entries, 2 do
    local value = entries[i + 1]
    local space = string.find(value, ' ', 1, true)
    local expires = tonumber(string.sub(value, 1, space - 1))
    if expires <= now then
      redis.call('HDEL', key, entries[i])
    else
      out[#out + 1] = pool
      out[#out + 1] = string.sub(value, space + 1)
      out[#out + 1] = tostring(expires)
    end
  end
end
return out
"""


@dataclass(frozen=True, slots=True)
class WorkerAnnouncement:
    """One live worker of a pool, as it last announced itself."""

    worker_id: str
    pool: str
    handlers: tuple[str, ...]
    concurrency: int
    #: Handlers it could start now (concurrency minus those running).
    free_slots: int
    version: str
    host: str
    pid: int
    started_at: datetime
    #: When the announcement lapses unless renewed (Redis's clock); None before it was written.
    expires_at: datetime | None = None

    def encode(self) -> bytes:
        body = asdict(self)
        body.pop("expires_at")
        return orjson.dumps(body)

    @classmethod
    def decode(cls, raw: bytes | str, expires_ms: int | None = None) -> WorkerAnnouncement:
        body = orjson.loads(raw)
        return cls(
            worker_id=str(body["worker_id"]),
            pool=str(body["pool"]),
            handlers=tuple(body.get("handlers") or ()),
            concurrency=int(body.get("concurrency") or 0),
            free_slots=int(body.get("free_slots") or 0),
            version=str(body.get("version") or ""),
            host=str(body.get("host") or ""),
            pid=int(body.get("pid") or 0),
            started_at=datetime.fromisoformat(body["started_at"]),
            expires_at=datetime.fromtimestamp(expires_ms / 1000, UTC) if expires_ms is not None else None,
        )


class WorkerAnnouncements:
    """Announce a worker, withdraw it, read the live workers of pools (see the module docstring)."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._announce = redis.register_script(_ANNOUNCE)
        self._live = redis.register_script(_LIVE)

    async def announce(self, announcement: WorkerAnnouncement, ttl_sec: float) -> None:
        """Write (or renew) ``announcement`` for ``ttl_sec`` from now: one round trip."""
        pool = announcement.pool
        await self._announce(
            keys=[POOL_KEY_PREFIX + pool, POOLS_KEY],
            args=[announcement.worker_id, announcement.encode(), max(1, int(ttl_sec * 1000)), pool],
        )

    async def withdraw(self, pool: str, worker_id: str) -> None:
        """Remove a worker's announcement at once (a graceful stop)."""
        await self.redis.hdel(POOL_KEY_PREFIX + pool, worker_id)

    async def live(self, pool: str) -> list[WorkerAnnouncement]:
        """The live workers of ``pool``, by worker id."""
        return (await self.live_pools((pool,))).get(pool, [])

    async def live_pools(self, pools: Iterable[str] | None = None) -> dict[str, list[WorkerAnnouncement]]:
        """The live workers of each of ``pools`` (None: of every pool announced), by pool; a pool without any is
        absent. One round trip."""
        raw = await self._live(keys=[POOLS_KEY], args=[POOL_KEY_PREFIX, *(pools or ())])
        found: dict[str, list[WorkerAnnouncement]] = {}
        for i in range(0, len(raw), 3):
            pool = raw[i].decode() if isinstance(raw[i], bytes) else str(raw[i])
            found.setdefault(pool, []).append(WorkerAnnouncement.decode(raw[i + 1], int(raw[i + 2])))
        for workers in found.values():
            workers.sort(key=lambda w: w.worker_id)
        return found


class LiveWorkersCache:
    """A pool's live workers as read at most ``ttl_sec`` ago: one Redis call per pool per moment, not per request.

    Good enough for warnings (a worker that just started shows within ``ttl_sec``); not for anything that must
    be exact.
    """

    def __init__(self, announcements: WorkerAnnouncements, ttl_sec: float = 1.0) -> None:
        self.announcements = announcements
        self.ttl_sec = ttl_sec
        self._read: dict[str, tuple[float, list[WorkerAnnouncement]]] = {}

    async def live(self, pool: str) -> list[WorkerAnnouncement]:
        now = time.monotonic()
        cached = self._read.get(pool)
        if cached is not None and now - cached[0] < self.ttl_sec:
            return cached[1]
        workers = await self.announcements.live(pool)
        if len(self._read) > 10_000:  # pools come and go; a bound, not an eviction policy
            self._read.clear()
        self._read[pool] = (now, workers)
        return workers
