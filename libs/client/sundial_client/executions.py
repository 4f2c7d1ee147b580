"""``client.executions``: read, list, follow, wait for, cancel and retry executions.

Written once, over asyncio (:class:`AsyncExecutions`); the blocking client runs these same methods on its own
event loop. The execution a trigger's 202 names is readable at once (PENDING until its shard leader has
created it), so ``trigger`` then ``wait`` needs nothing in between.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any

from sundial_client import calls
from sundial_client.caller import Caller, check_page_size, pages
from sundial_client.models import AuditEntry, Execution, ExecutionDetail, ExecutionState


class WaitTimedOut(TimeoutError):
    """``wait`` gave up: the execution had not ended within its ``timeout``; ``last`` is how it was then."""

    def __init__(self, execution_id: str, timeout: float, last: ExecutionDetail) -> None:
        super().__init__(f"execution {execution_id} still {last.state} after {timeout:g}s")
        self.last = last


class AsyncExecutions:
    """``client.executions``."""

    def __init__(self, client: Caller) -> None:
        self.client = client

    async def get(self, execution_id: str) -> ExecutionDetail:
        """The execution with every attempt (worker, times, error, progress) and its trace."""
        return await self.client.call(calls.get_execution(execution_id))

    async def cancel(self, execution_id: str) -> Execution:
        """CANCELLED at once if it had not started; a RUNNING one is asked to stop (``cancel_requested_at``)."""
        return await self.client.call(calls.cancel_execution(execution_id))

    async def retry(self, execution_id: str) -> Execution:
        """One more attempt for a DEAD execution."""
        return await self.client.call(calls.retry_execution(execution_id))

    def list(
        self,
        state: ExecutionState | str | None = None,
        *,
        job_id: str | None = None,
        pool: str | None = None,
        handler: str | None = None,
        scheduled_from: datetime | None = None,
        scheduled_to: datetime | None = None,
        page_size: int = 50,
    ) -> AsyncIterator[Execution]:
        """The tenant's executions, newest first; only those in ``state`` (``DEAD``: the dead letters), of
        ``job_id``, ``pool``, ``handler``, scheduled in ``[scheduled_from, scheduled_to)``, if given."""
        size = check_page_size(page_size)
        return pages(
            self.client,
            lambda cursor: calls.list_executions(
                state,
                cursor=cursor,
                limit=size,
                job_id=job_id,
                pool=pool,
                handler=handler,
                scheduled_from=scheduled_from,
                scheduled_to=scheduled_to,
            ),
        )

    def audit(
        self, execution_id: str, *, actions: Sequence[str] = (), page_size: int = 100
    ) -> AsyncIterator[AuditEntry]:
        """The execution's audit trail, oldest first: dispatch, each attempt's start and end, retries, cancels."""
        size = check_page_size(page_size)
        return pages(
            self.client,
            lambda cursor: calls.audit("executions", execution_id, actions=actions, cursor=cursor, limit=size),
        )

    async def watch(self, execution_id: str, *, poll_sec: float = 1.0) -> AsyncIterator[ExecutionDetail]:
        """The execution now, then each time it changes (state, attempt, worker, progress), until it has ended."""
        last: tuple[Any, ...] | None = None
        while True:
            current = await self.get(execution_id)
            progress = [a.progress for a in current.attempts]
            seen = (current.state, current.attempt, current.worker_id, current.next_attempt_at, progress)
            if seen != last:
                last = seen
                yield current
            if current.ended:
                return
            await self.client.sleep(poll_sec)

    # A deadline of its own rather than asyncio.timeout: the blocking client exposes this method as it is.
    async def wait(
        self,
        execution_id: str,
        *,
        poll_sec: float = 1.0,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> ExecutionDetail:
        """Its final view, once it has ended; :class:`WaitTimedOut` if it has not within ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        current: ExecutionDetail | None = None
        while True:
            current = await self.get(execution_id)
            if current.ended:
                return current
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WaitTimedOut(execution_id, timeout or 0.0, current)
                await self.client.sleep(min(poll_sec, left))
            else:
                await self.client.sleep(poll_sec)
