"""The gateway's callers as their pool's live workers: each pulling session announced as a direct worker announces
itself.

The dispatcher sizes a pool's first queue by the free slots its live workers announce, the sweeper counts them, the
API warns about a pool nobody reads — all from :mod:`sundial_common.hotwindow.worker_announcements`. A worker behind
the gateway holds no Redis credential, so the gateway announces it: on a session's first pull, then again at most
every ``interval_sec`` while it keeps pulling (heartbeats renew it too, so a worker busy with long handlers stays
announced), each lasting ``ttl_sec`` — a worker's interval and TTL, so a gateway worker appears, stays and lapses
exactly as a direct one. It is announced under its worker identity (:func:`sundial_gateway.leases.worker_id`), with
what its pull says of it (``worker``: concurrency, free slots, handlers, version; a worker that does not say is
taken to have ``max`` free slots of ``max``). A session that stops calling drops out ``ttl_sec`` after its last call.

Redis trouble is never fatal here: a missed announcement makes the worker look absent for a moment, which only shows
in warnings and in the dispatcher's first queue bound.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from redis.exceptions import RedisError
from sundial_common.hotwindow.worker_announcements import WorkerAnnouncement, WorkerAnnouncements

log = logging.getLogger("sundial.gateway")

#: A direct worker's renewal interval and announcement lifetime (``sundial_worker.announcer.AnnounceConfig``).
INTERVAL_SEC = 2.0
TTL_SEC = 12.0


@dataclass(frozen=True, slots=True)
class Announced:
    """What a session's pull says of its worker."""

    concurrency: int
    free_slots: int
    handlers: tuple[str, ...] = ()
    version: str = ""
    host: str = ""


@dataclass(slots=True)
class _Seen:
    started_at: datetime
    announced_at: float
    caller: Announced


class Presence:
    """Announces the sessions that call this gateway: see the module docstring."""

    def __init__(
        self,
        announcements: WorkerAnnouncements,
        *,
        interval_sec: float = INTERVAL_SEC,
        ttl_sec: float = TTL_SEC,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < interval_sec < ttl_sec:
            raise ValueError(f"Presence interval_sec ({interval_sec}) must be above 0 and below ttl_sec ({ttl_sec})")
        self.announcements = announcements
        self.interval_sec = interval_sec
        self.ttl_sec = ttl_sec
        self._clock = clock
        #: Per (pool, worker id): when this gateway first saw it, last announced it, and what it said.
        self._seen: dict[tuple[str, str], _Seen] = {}

    async def pulled(self, pool: str, worker_id: str, caller: Announced) -> bool:
        """A session of ``pool`` pulls: announce it unless this gateway did within ``interval_sec`` (its free slots
        are news to the dispatcher at the next renewal, as a direct worker's; one announced with none free and
        pulling again is announced at once). Whether it was announced."""
        now = self._clock()
        seen = self._seen.get((pool, worker_id))
        came_back = seen is not None and seen.caller.free_slots == 0 < caller.free_slots
        if seen is not None and now - seen.announced_at < self.interval_sec and not came_back:
            return False
        return await self._announce(pool, worker_id, caller, now, seen)

    async def renewed(self, pool: str, worker_id: str, running: int) -> bool:
        """A session heartbeats ``running`` executions: renew its announcement if due (it may pull rarely, all its
        slots busy). A session never seen pulling here (it pulled at another gateway) is left to that one."""
        now = self._clock()
        seen = self._seen.get((pool, worker_id))
        if seen is None or now - seen.announced_at < self.interval_sec:
            return False
        free = max(0, seen.caller.concurrency - running)
        caller = Announced(seen.caller.concurrency, free, seen.caller.handlers, seen.caller.version, seen.caller.host)
        return await self._announce(pool, worker_id, caller, now, seen)

    async def _announce(self, pool: str, worker_id: str, caller: Announced, now: float, seen: _Seen | None) -> bool:
        if seen is None:
            self._forget_lapsed(now)
            seen = self._seen[(pool, worker_id)] = _Seen(datetime.now(UTC), now, caller)
        seen.announced_at, seen.caller = now, caller
        announcement = WorkerAnnouncement(
            worker_id=worker_id,
            pool=pool,
            handlers=caller.handlers,
            concurrency=caller.concurrency,
            free_slots=caller.free_slots,
            version=caller.version,
            host=caller.host,
            pid=0,
            started_at=seen.started_at,
        )
        try:
            await self.announcements.announce(announcement, self.ttl_sec)
        except (RedisError, OSError) as exc:
            seen.announced_at = now - self.interval_sec  # try again at its next call
            log.warning("worker %s of pool %s: announcement not renewed: %r", worker_id, pool, exc)
            return False
        return True

    def _forget_lapsed(self, now: float) -> None:
        lapsed = [key for key, seen in self._seen.items() if now - seen.announced_at >= self.ttl_sec]
        for key in lapsed:
            del self._seen[key]
