"""Gateway callers announced as live workers: at a session's first pull, renewed at a direct worker's interval by its
pulls and heartbeats (free slots from what it runs), at once when it pulls again after announcing none free, and
never failing a call when Redis does."""

from __future__ import annotations

from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from sundial_common.hotwindow.worker_announcements import WorkerAnnouncement
from sundial_gateway.presence import Announced, Presence


class _Announcements:
    def __init__(self) -> None:
        self.written: list[tuple[WorkerAnnouncement, float]] = []
        self.failing = False

    async def announce(self, announcement: WorkerAnnouncement, ttl_sec: float) -> None:
        if self.failing:
            raise RedisConnectionError("redis is away")
        self.written.append((announcement, ttl_sec))


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _presence() -> tuple[Presence, _Announcements, _Clock]:
    announcements, clock = _Announcements(), _Clock()
    fake: Any = announcements
    return Presence(fake, interval_sec=2.0, ttl_sec=12.0, clock=clock), announcements, clock


async def test_a_session_is_announced_at_its_first_pull_and_renewed_at_the_interval() -> None:
    presence, announcements, clock = _presence()
    said = Announced(16, 16, ("echo",), "1.0", "10.0.0.7")
    assert await presence.pulled("mail", "gw:pt_1:s1", said)
    written, ttl = announcements.written[-1]
    assert (written.worker_id, written.pool, written.free_slots, written.concurrency) == ("gw:pt_1:s1", "mail", 16, 16)
    assert (written.handlers, written.host, ttl) == (("echo",), "10.0.0.7", 12.0)

    clock.now += 1.0
    assert not await presence.pulled("mail", "gw:pt_1:s1", said), "within the interval: not again"
    clock.now += 1.0
    assert await presence.pulled("mail", "gw:pt_1:s1", Announced(16, 3, ("echo",)))
    assert announcements.written[-1][0].started_at == written.started_at, "the same worker, renewed"

    # Busy with long handlers, it heartbeats instead of pulling: renewed with none free ...
    clock.now += 2.0
    assert await presence.renewed("mail", "gw:pt_1:s1", running=16)
    assert announcements.written[-1][0].free_slots == 0
    # ... and announced at once when it pulls again with a slot free.
    clock.now += 0.1
    assert await presence.pulled("mail", "gw:pt_1:s1", Announced(16, 1, ("echo",)))
    assert announcements.written[-1][0].free_slots == 1

    # A session that pulled at another gateway is that one's to announce.
    assert not await presence.renewed("mail", "gw:pt_1:elsewhere", running=1)


async def test_redis_trouble_does_not_fail_the_call_and_is_retried_at_the_next() -> None:
    presence, announcements, clock = _presence()
    announcements.failing = True
    assert not await presence.pulled("mail", "gw:pt_1:s2", Announced(4, 4))
    announcements.failing = False
    clock.now += 0.1
    assert await presence.pulled("mail", "gw:pt_1:s2", Announced(4, 4)), "tried again at the next pull"
