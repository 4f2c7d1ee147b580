"""Waiting on etcd and on events without hanging: the first of a piece of work and some events, work bounded by a
deadline on an injected clock, a watch cancelled within a deadline, and which etcd errors are not worth retrying."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions

from sundial_common.runtime.clock import Clock

__all__ = ["PERMANENT_ERRORS", "WATCH_RECHECK_SEC", "cancel_watch", "event_or_quiet", "first_of", "within"]

T = TypeVar("T")

#: A standby, and a leader's key guard, re-read the key this often even without a watch event: a watch stream can
#: die silently (a network partition without a reset), and neither must wait forever on it.
WATCH_RECHECK_SEC = 10.0

# Longest wait for etcd to take a watch's cancel request (see cancel_watch).
_CANCEL_WATCH_SEC = 1.0

#: Errors that are the caller's configuration, not etcd's weather: retrying them would loop forever.
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    aetcd.InvalidArgumentError,
    aetcd.exceptions.UnauthenticatedError,
)


async def cancel_watch(watch: Any) -> None:
    """Cancel an aetcd watch, within a deadline.

    aetcd's ``Watch.cancel()`` raises AttributeError once its client is closed (the watcher is gone): the
    watch is dead either way. And it queues the cancel request on a bounded queue *while holding the
    watcher's lock*: when the stream is down (etcd restarting) nothing drains that queue, the put blocks, and
    every task that needs the lock — a new watch, even a cancelled one re-acquiring it — blocks with it. Seen
    after an etcd restart: a shard campaign stuck for good and a dispatcher that could not stop. The
    deadline cancels the put, which releases the lock.
    """
    with contextlib.suppress(AttributeError, aetcd.ClientError, TimeoutError):
        await asyncio.wait_for(watch.cancel(), _CANCEL_WATCH_SEC)


async def first_of(work: Awaitable[T], *events: asyncio.Event) -> T | None:
    """``work``'s result, or None (and ``work`` cancelled) if one of ``events`` is set first."""
    work_task = asyncio.ensure_future(work)
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait({work_task, *waiters}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        if not work_task.done():
            work_task.cancel()
            await asyncio.wait({work_task})
    if work_task.cancelled():
        return None
    return work_task.result()


async def within(work: Awaitable[T], seconds: float, clock: Clock) -> T:
    """Await ``work``, or raise TimeoutError once ``seconds`` have passed on ``clock`` (a fake one in tests)."""
    work_task = asyncio.ensure_future(work)
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait({work_task, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
        if not work_task.done():
            work_task.cancel()
    if not work_task.done():
        raise TimeoutError
    return work_task.result()


async def event_or_quiet(next_event: asyncio.Future[Any], clock: Clock) -> bool:
    """Wait for a watch's next event, or :data:`WATCH_RECHECK_SEC` of quiet on ``clock`` (then the caller re-reads
    the key: a watch can die silently); True if the event came."""
    timer = asyncio.ensure_future(clock.sleep(WATCH_RECHECK_SEC))
    try:
        await asyncio.wait({next_event, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
    return next_event.done()
