"""Concurrent calls' start and finish compare-and-swaps gathered into one statement each.

Each pull claims its batch with a start CAS of its own, each finish ends its attempts with a finish CAS; under load,
many calls of one gateway come at once and each paid a statement and a transaction for a handful of executions.
:class:`Gather` is a group commit: a request goes to ``flush`` at once when fewer than ``parallel`` flushes are in
flight (a call alone waits for nothing), and otherwise waits for one of them to end and goes with every request that
came in meanwhile, in one ``flush`` call; each caller gets its own answer. The busier the gateway, the larger the
batches, with no timer. :class:`StartGather` is that for ``executions.start_executions_as``: the claims of every
gathered pull, each under its caller's worker id, in one statement; each pull gets back only the rows started for its
own worker id and claims. :class:`FinishGather` is that for ``executions.finish_attempts_as``: each call gets back
only its own accepted finishes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Generic, TypeVar
from uuid import UUID

from sundial_common.stores.executions import ExecutionStore, Finished, Outcome
from sundial_common.stores.types import Record

#: Flushes in flight at once: a request waits only while this many are (the direct worker keeps two claims in flight).
PARALLEL = 2

T = TypeVar("T")
R = TypeVar("R")


class Gather(Generic[T, R]):
    """Requests go to ``flush`` together, answers in order: at once while fewer than ``parallel`` flushes are in
    flight, else with everything that came in while one was. ``window_sec``: how long a flush waits for company
    before it takes its batch (0: only the calls made in the same turn of the event loop)."""

    def __init__(
        self, flush: Callable[[list[T]], Awaitable[list[R]]], window_sec: float = 0.0, parallel: int = PARALLEL
    ) -> None:
        if parallel < 1:
            raise ValueError(f"Gather parallel ({parallel}) must be at least 1")
        self._flush = flush
        self._window = window_sec
        self._parallel = parallel
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._flushing: set[asyncio.Task[None]] = set()

    async def submit(self, request: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((request, future))
        if len(self._flushing) < self._parallel:
            task = asyncio.create_task(self._run(), name="sundial-gateway-gather")
            self._flushing.add(task)
            task.add_done_callback(self._flushing.discard)
        return await future

    async def _run(self) -> None:
        await asyncio.sleep(self._window)
        while self._waiting:  # what came in during this flush goes next, without waiting for a new one
            batch, self._waiting = self._waiting, []
            await self._answer(batch)

    async def _answer(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
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
    """The start CAS of concurrent pulls, gathered: one ``start_executions_as`` for the pulls that met."""

    def __init__(self, executions: ExecutionStore, window_sec: float = 0.0) -> None:
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
    """The finish CAS of concurrent finish calls, gathered: one ``finish_attempts_as`` for the calls that met."""

    def __init__(self, executions: ExecutionStore, window_sec: float = 0.0) -> None:
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
