"""The worker runtime's side tasks: each named ``sundial-worker-<loop>``, and any that dies fails the runtime.

A side task that raises, returns or is cancelled while the runtime is not stopping is a crash: it is logged as
critical, the first failure is kept, and :attr:`SideTasks.crashed` is set, which makes
:meth:`~sundial_worker.runtime.WorkerRuntime.run_until` stop the worker and raise
:class:`~sundial_worker.errors.WorkerCrashed`. While stopping, tasks ending is what is expected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger("sundial.worker")


class SideTasks:
    """The named tasks of one runtime, and the first failure among them (or reported to it)."""

    def __init__(self, stopping: asyncio.Event) -> None:
        self._stopping = stopping
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.crashed = asyncio.Event()
        """Set at the first failure."""
        self.failure: BaseException | None = None
        """The first failure, if any."""

    def spawn(self, name: str, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        task = asyncio.create_task(loop(), name=f"sundial-worker-{name}")
        self._tasks[name] = task
        task.add_done_callback(lambda t: self._on_done(name, t))

    def running(self, name: str) -> asyncio.Task[None] | None:
        """The task ``name`` if it has not ended."""
        task = self._tasks.get(name)
        return None if task is None or task.done() else task

    async def cancel(self, name: str) -> None:
        task = self.running(name)
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def fail(self, what: str, exc: BaseException) -> None:
        log.critical("%s died; the worker is shutting down", what, exc_info=exc)
        if self.failure is None:
            self.failure = exc
        self.crashed.set()

    def _on_done(self, name: str, task: asyncio.Task[None]) -> None:
        stopping = self._stopping.is_set()
        if task.cancelled():
            if not stopping:
                self.fail(f"side task {name}", RuntimeError(f"side task {name} was cancelled"))
            return
        exc = task.exception()
        if exc is not None:
            self.fail(f"side task {name}", exc)
        elif not stopping:
            self.fail(f"side task {name}", RuntimeError(f"side task {name} returned unexpectedly"))
