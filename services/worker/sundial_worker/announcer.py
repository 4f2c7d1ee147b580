"""This worker's announcement: its pool, handlers, concurrency and free slots, renewed every heartbeat interval.

What it writes and how readers use it is :mod:`sundial_common.hotwindow.worker_announcements`; this module only
says, for one runtime, what to announce and when. The first announcement is written once the consumer has joined
its group (the worker is then really reading the pool); a graceful stop withdraws it as soon as the worker stops
taking work. Redis trouble is never fatal here: a missed renewal makes the worker look absent for a moment, which
only shows in warnings — the execution path does not read announcements.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version

from sundial_common.hotwindow.worker_announcements import WorkerAnnouncement, WorkerAnnouncements

from sundial_worker.errors import REDIS_ERRORS, check_positive_int, check_seconds
from sundial_worker.sdk import Worker

log = logging.getLogger("sundial.worker")


def sdk_version() -> str:
    """This SDK's version, as its workers announce it."""
    try:
        return version("sundial-worker")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


@dataclass(frozen=True, slots=True)
class AnnounceConfig:
    """When the announcement is renewed and how long one lasts unrenewed."""

    concurrency: int = 16
    interval_sec: float = 2.0
    """How often the announcement is renewed (the worker's heartbeat interval)."""
    ttl_sec: float = 12.0
    """How long an announcement lasts unrenewed: a killed worker drops out of the pool this long after."""

    def __post_init__(self) -> None:
        check_positive_int(self, "concurrency")
        check_seconds(self, "interval_sec", "ttl_sec")
        if self.ttl_sec <= self.interval_sec:
            raise ValueError(f"AnnounceConfig.ttl_sec ({self.ttl_sec}) must exceed interval_sec ({self.interval_sec})")


class Announcer:
    """Announces one worker runtime until it stops (loop ``announce``): a production runtime, or a staging pool's
    (its live workers show alike); ``busy`` says how many handlers it runs now."""

    def __init__(
        self,
        announcements: WorkerAnnouncements,
        worker: Worker,
        worker_id: str,
        config: AnnounceConfig,
        *,
        busy: Callable[[], int],
    ) -> None:
        self.announcements = announcements
        self.worker = worker
        self.worker_id = worker_id
        self.config = config
        self.busy = busy
        self.started_at = datetime.now(UTC)
        self._version = sdk_version()
        self._host = socket.gethostname()
        self._withdrawn = False

    def announcement(self) -> WorkerAnnouncement:
        return WorkerAnnouncement(
            worker_id=self.worker_id,
            pool=self.worker.pool,
            handlers=tuple(sorted(self.worker.registry.names())),
            concurrency=self.config.concurrency,
            free_slots=max(0, self.config.concurrency - self.busy()),
            version=self._version,
            host=self._host,
            pid=os.getpid(),
            started_at=self.started_at,
        )

    async def run_once(self) -> bool:
        """Announce (renew) now; False if Redis did not take it (logged)."""
        if self._withdrawn:
            return False
        try:
            await self.announcements.announce(self.announcement(), self.config.ttl_sec)
        except REDIS_ERRORS as exc:
            log.warning("worker %s: announcement not renewed: %r", self.worker_id, exc)
            return False
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval_sec)
            await self.run_once()

    async def withdraw(self) -> None:
        """Leave the pool's live workers now (a graceful stop); idempotent."""
        if self._withdrawn:
            return
        self._withdrawn = True
        try:
            await self.announcements.withdraw(self.worker.pool, self.worker_id)
        except REDIS_ERRORS as exc:
            log.warning(
                "worker %s: announcement not withdrawn (it lapses within %.0fs): %r",
                self.worker_id,
                self.config.ttl_sec,
                exc,
            )
