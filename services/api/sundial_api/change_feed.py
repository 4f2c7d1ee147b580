"""One change feed per API process: which tenants' jobs and executions changed, from the audit log.

Every change a console page shows — a job created, paused or triggered, an execution dispatched, started,
finished, retried or dead — writes an audit row in the statement that makes it. Once a second, while anyone
watches, :class:`ChangeFeed` asks Postgres for the audit rows of the last few seconds (a range on the primary
key) and keeps, per tenant, a version that any new row changes. A console tab refreshing a live region sends
the version it shows; an unchanged version is answered without reading anything. So the database sees one
query a second per process, however many tabs are open.

The window is the last :attr:`ChangeFeed.window_polls` polls' worth of rows, not only the rows since the last
poll, so a transaction that took an id early and committed a little later still changes its tenant's version.
A row leaving the window changes it too: a spurious refresh, never a missed one. Progress heartbeats write no
audit row; the console re-reads a live region at least every few seconds anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque

from sundial_common.stores.audit import AuditStore

log = logging.getLogger("sundial.api.changes")


class ChangeFeed:
    """Per-tenant versions of what changed recently, polled while anyone asks (see the module docstring)."""

    def __init__(
        self, audit: AuditStore, *, interval_sec: float = 1.0, window_polls: int = 10, idle_sec: float = 60.0
    ) -> None:
        if interval_sec <= 0 or window_polls < 1 or idle_sec <= 0:
            raise ValueError("interval_sec and idle_sec must be positive, window_polls at least 1")
        self.interval_sec = interval_sec
        self.window_polls = window_polls
        self.idle_sec = idle_sec
        self._audit = audit
        #: The newest audit id seen at each of the last polls; the window starts above the oldest.
        self._marks: deque[int] = deque(maxlen=window_polls)
        self._versions: dict[str, str] = {}
        self._ready = False
        self._asked_at = 0.0
        self._task: asyncio.Task[None] | None = None

    def version(self, tenant: str) -> str | None:
        """The tenant's current version, or None while the feed is not polling (then assume a change).

        Asking (re)starts the feed: it polls while someone asked within ``idle_sec``.
        """
        self._asked_at = time.monotonic()
        if self._task is None or self._task.done():  # a task that ended cleared what it knew
            self._task = asyncio.get_running_loop().create_task(self._run(), name="console-change-feed")
        if not self._ready:
            return None
        return self._versions.get(tenant, "0")

    async def run_once(self) -> int:
        """One poll; how many tenants have rows in the window."""
        if not self._marks:
            self._marks.append(await self._audit.newest_id())
        changes, newest = await self._audit.changes_since(self._marks[0])
        self._marks.append(newest)
        self._versions = {tenant: f"{rows}.{ids}" for tenant, (rows, ids) in changes.items()}
        self._ready = True
        return len(changes)

    async def _run(self) -> None:
        try:
            while time.monotonic() - self._asked_at < self.idle_sec:
                try:
                    await self.run_once()
                except Exception as exc:  # Postgres away, or anything else: pages then read on every refresh
                    self._ready = False
                    log.warning("console change feed: poll failed: %r", exc)
                await asyncio.sleep(self.interval_sec)
        finally:
            self._ready = False
            self._marks.clear()

    async def stop(self) -> None:
        """Stop polling (safe before any start and twice)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
