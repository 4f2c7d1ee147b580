"""Concurrent calls' start and finish compare-and-swaps gathered into one statement each.

Each pull claims its batch with a start CAS of its own, each finish ends its attempts with a finish CAS; under load,
many calls of one gateway come at once and each paid a statement and a transaction for a handful of executions.
:class:`Gather` holds a request for ``window_sec`` after the first of a batch arrives, then hands every request that
came in to one ``flush`` call and gives each caller its own answer. :class:`StartGather` is that for
``executions.start_executions_as``: the claims of every gathered pull, each under its caller's worker id, in one
statement; each pull gets back only the rows started for its own worker id and claims. :class:`FinishGather` is
that for ``executions.finish_attempts_as``: each call gets back only its own accepted finishes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Generic, TypeVar
from uuid import UUID

from sundial_common.stores.executions import ExecutionStore, Finished, Outcome
from sundial_common.stores.types import Record

#: How long the first request of a batch waits for others to join it: a few ms, far below a pull's own wait.
GATHER_SEC = 0.002

T = TypeVar("T")
R = TypeVar("R")


class Gather(Generic[T, R]):
    """Requests arriving within ``window_sec`` of a batch's first go to ``flush`` together, answers in order."""

    def __init__(self, flush: Callable[[list[T]], Awaitable[list[R]]], window_sec: float = GATHER_SEC) -> None:
        self._flush = flush
        self._window = window_sec
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._task: asyncio.Task[None] | None = None

    async def submit(self, request: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((request, future))
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="sundial-gateway-gather")
        return await future

    async def _run(self) -> None:
        await asyncio.sleep(self._window)
        batch, self._waiting, self._task = self._waiting, [], None  # later requests open a batch of their own
        try:
            answers = await self._flush([request for request, _ in batch])
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for (_, future), answer in zip(batch, answers, strict=True):
            if not future.done():
                future.set_result(answer)


StartRequest = tuple[str, Sequence[tuple[UUID, int]], Sequence[datetime | None]]


class StartGather:
    """The start CAS of concurrent pulls, gathered: one ``start_executions_as`` for all of a few ms."""

    def __init__(self, executions: ExecutionStore, window_sec: float = GATHER_SEC) -> None:
        self._executions = executions
        self._gather: Gather[StartRequest, list[Record]] = Gather(self._flush, window_sec)

    async def start(
        self, worker: str, claims: Sequence[tuple[UUID, int]], published_at: Sequence[datetime | None]
    ) -> list[Record]:
        """The rows of ``claims`` started for ``worker`` (as ``start_executions`` would return them)."""
        if not claims:
            return []
        return await self._gather.submit((worker, claims, published_at))

    async def _flush(self, requests: list[StartRequest]) -> list[list[Record]]:
        seen: set[tuple[UUID, int]] = set()
        claims: list[tuple[UUID, int, str]] = []
        sent: list[datetime | None] = []
        for worker, theirs, published in requests:
            for claim, at in zip(theirs, list(published) or [None] * len(theirs), strict=True):
                if claim not in seen:  # a message two pulls took: the first claim only (the second would lose)
                    seen.add(claim)
                    claims.append((claim[0], claim[1], worker))
                    sent.append(at)
        rows = await self._executions.start_executions_as(claims, sent)
        by_worker: dict[str, list[Record]] = {}
        for row in rows:
            by_worker.setdefault(row["worker_id"], []).append(row)
        answers: list[list[Record]] = []
        given: set[tuple[UUID, int]] = set()  # each started row to one request only
        for worker, theirs, _ in requests:
            wanted = set(theirs) - given
            mine = [row for row in by_worker.get(worker, []) if (row["id"], row["attempt"]) in wanted]
            given.update((row["id"], row["attempt"]) for row in mine)
            answers.append(mine)
        return answers


FinishRequest = tuple[str, Sequence[Outcome]]


class FinishGather:
    """The finish CAS of concurrent finish calls, gathered: one ``finish_attempts_as`` for all of a few ms."""

    def __init__(self, executions: ExecutionStore, window_sec: float = GATHER_SEC) -> None:
        self._executions = executions
        self._gather: Gather[FinishRequest, list[Finished]] = Gather(self._flush, window_sec)

    async def finish(self, worker: str, outcomes: Sequence[Outcome]) -> list[Finished]:
        """The finishes of ``outcomes`` accepted for ``worker`` (as ``finish_attempts`` would return them)."""
        if not outcomes:
            return []
        return await self._gather.submit((worker, outcomes))

    async def _flush(self, requests: list[FinishRequest]) -> list[list[Finished]]:
        owner: dict[tuple[UUID, int], int] = {}  # each attempt to the first request naming it
        outcomes: list[tuple[str, Outcome]] = []
        for n, (worker, theirs) in enumerate(requests):
            for outcome in theirs:
                key = (outcome.execution_id, outcome.attempt)
                if key not in owner:  # a finish repeated at once: the later one is answered as a repeat
                    owner[key] = n
                    outcomes.append((worker, outcome))
        answers: list[list[Finished]] = [[] for _ in requests]
        for finished in await self._executions.finish_attempts_as(outcomes):
            answers[owner[(finished.execution_id, finished.attempt)]].append(finished)
        return answers
