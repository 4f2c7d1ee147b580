"""Group commit of single creates: concurrent ``POST /v1/jobs`` requests are written by one statement.

A single create written on its own costs one statement, one commit (a WAL flush) and the client-side work of
one round trip; under load that was most of the API's and of Postgres' CPU per job (bench ``create``: API
0.41 ms of client CPU per single INSERT against 0.04 ms per job of a 100-row one). So each request, once
validated, hands its job to :class:`CreateGroups` and waits. Up to ``writers`` groups are written at once
(a commit waits for its WAL flush, and Postgres flushes concurrent commits together); while they are, the jobs
of the requests that arrive meanwhile gather into the next group, written as soon as a writer is free. A
lone request is written at once (no added wait); under load a group holds as many jobs as arrived during
one write (up to ``max_jobs``).

What each request still gets for itself:

- its own row and answer: the statement returns every row and each waiter receives its own;
- durability before its answer: a waiter is answered only after the group's statement committed, and the
  near-due jobs of the group are in the Redis hot window by then (as for a lone create; best effort);
- its own failure: validation, quotas and idempotency keys are checked before a job joins a group (a
  tenant with ``maxActiveJobs`` and keyed or dependent creates keep their own transactions), and a group
  whose statement Postgres refuses is retried job by job, so one job Postgres will not take fails alone;
  an unreachable database fails every waiter of the group (503, as it would each of them alone).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg
from redis.exceptions import RedisError
from sundial_common.hotwindow.window import HotWindow
from sundial_common.stores.jobs import JobStore
from sundial_common.stores.types import Occurrence, Record

log = logging.getLogger("sundial.api")

#: Also add occurrences due a little past the horizon: a hydrator pass that read Postgres before the job
#: committed may already have moved its watermark past it (or run on a clock slightly ahead). A member a
#: minute beyond the window costs nothing; a missed one would fire only at the overdue scan.
HOT_WINDOW_MARGIN = timedelta(seconds=60)

#: Errors that say the database itself is unavailable, not that it refused some job: retrying the group's jobs
#: one by one could not help.
_UNAVAILABLE = (
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
)


async def add_near_due(hot_window: HotWindow, rows: Sequence[Record], horizon: datetime) -> None:
    """Put the jobs of ``rows`` due before ``horizon`` into their shards' hot windows, one call per shard.

    Best effort: Postgres has the truth and the hydrator's overdue scan repairs a failed write (logged).
    """
    by_shard: dict[int, list[Occurrence]] = {}
    for row in rows:
        due = row["next_fire_at"]
        if due is not None and due < horizon:
            by_shard.setdefault(row["shard"], []).append(Occurrence(row["id"], due))
    try:
        for shard, occurrences in by_shard.items():
            await hot_window.add(shard, occurrences)
    except (RedisError, OSError) as exc:
        log.warning("jobs stored but hot-window members not all added (the hydrator will repair it): %r", exc)


@dataclass(slots=True)
class _Waiter:
    values: Mapping[str, Any]
    actor: str
    answer: asyncio.Future[Record]


class CreateGroups:
    """The API process's group commit of single creates (see the module docstring).

    ``horizon()`` is how far ahead a job must be due to go into the hot window (now + window + margin).
    """

    def __init__(
        self,
        jobs: JobStore,
        hot_window: HotWindow,
        horizon: Callable[[], datetime],
        max_jobs: int = 500,
        writers: int = 4,
    ) -> None:
        self.jobs = jobs
        self.hot_window = hot_window
        self.horizon = horizon
        self.max_jobs = max_jobs
        self.writers = writers
        self._waiting: list[_Waiter] = []
        self._writers: set[asyncio.Task[None]] = set()
        #: Groups written and jobs in them, for the tests and the bench (how big groups get under load).
        self.groups = 0
        self.grouped_jobs = 0

    async def create(self, values: Mapping[str, Any], actor: str) -> Record:
        """Write the job described by ``values`` (with ``actor`` on its audit row) in the next group; its row
        once the group committed."""
        answer: asyncio.Future[Record] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiter(values, actor, answer))
        if len(self._writers) < self.writers:
            writer = asyncio.create_task(self._write_groups())
            self._writers.add(writer)
            writer.add_done_callback(self._writers.discard)
        return await answer

    async def _write_groups(self) -> None:
        group: list[_Waiter] = []
        try:
            while self._waiting:
                group, self._waiting = self._waiting[: self.max_jobs], self._waiting[self.max_jobs :]
                # A request whose client went away before its group was taken: not written (it was never
                # answered, as a request cancelled before its INSERT). Once taken, the job is written.
                group = [w for w in group if not w.answer.done()]
                if group:
                    await self._write(group)
        except BaseException:  # cancelled (the process stops): no waiter may wait forever
            for waiter in (*group, *self._waiting):
                waiter.answer.cancel()
            self._waiting = []
            raise

    async def _write(self, group: list[_Waiter]) -> None:
        try:
            rows = await self.jobs.insert_grouped_jobs([(w.values, w.actor) for w in group])
        except asyncpg.PostgresError as exc:
            if len(group) > 1 and not isinstance(exc, _UNAVAILABLE):
                # Nothing of the group was written; Postgres refused some job of it: each on its own, so that
                # job fails alone and the others are written.
                log.warning("a group of %d creates was refused (%r): writing them one by one", len(group), exc)
                for waiter in group:
                    await self._write([waiter])
                return
            self._fail(group, exc)
            return
        except Exception as exc:  # the database is gone, a bug: every waiter answers with it
            self._fail(group, exc)
            return
        self.groups += 1
        self.grouped_jobs += len(rows)
        try:
            await add_near_due(self.hot_window, rows, self.horizon())
        except Exception:  # the jobs are committed: whatever went wrong here, each request gets its job
            log.exception("jobs stored but not put into the hot window (the hydrator will)")
        for waiter, row in zip(group, rows, strict=True):
            if not waiter.answer.done():
                waiter.answer.set_result(row)

    @staticmethod
    def _fail(group: list[_Waiter], exc: Exception) -> None:
        for waiter in group:
            if not waiter.answer.done():
                waiter.answer.set_exception(exc)
