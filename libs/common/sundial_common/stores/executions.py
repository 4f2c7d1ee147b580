"""The execution store: executions and their attempts once they exist — the API's reads, cancels and retries
of dead ones; the worker's start compare-and-swap, outcomes, progress and cancel checks; the sweeper's scan
of running attempts, its ending of lost ones, and the dead-letter outbox.

SQL: ``sql/executions.sql``. Creating executions (and moving a retry back to PENDING) is the fenced
dispatch store's (:mod:`sundial_common.stores.dispatch`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, cast
from uuid import UUID

from sundial_common.domain.ids import new_execution_id
from sundial_common.stores.database import Database
from sundial_common.stores.queries import load_file
from sundial_common.stores.types import Record, RetryDue

Q = load_file("executions.sql")


#: ``Outcome.retry_delay_ms`` of a failure no retry can mend (an HTTP target's 4xx): the execution is DEAD at once.
NO_RETRY = -1


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one attempt ended, as the worker reports it."""

    execution_id: UUID
    attempt: int
    state: str
    result: Any = None
    error: str | None = None
    #: For a FAILED or TIMED_OUT attempt: how long until the next one, if the execution has attempts left;
    #: :data:`NO_RETRY` (negative) makes it DEAD now whatever attempts are left.
    retry_delay_ms: int = 0
    #: The handler's traceback (sealed, bounded), for an attempt its handler failed; kept on the attempt only.
    traceback: str | None = None
    #: The last lines the handler logged through ``ctx.logger`` (sealed, bounded); kept on the attempt only.
    log_tail: str | None = None
    #: When the handler was launched, for an attempt claimed ahead of its instant (its start CAS recorded the instant
    #: it was to be launched at): the attempt's ``started_at`` becomes this.
    started_at: datetime | None = None
    #: When the handler ended (None: the time of the write), on the worker's clock like ``started_at``.
    finished_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Finished:
    """An outcome Postgres accepted: how the attempt ended and what became of the execution."""

    execution_id: UUID
    attempt: int
    tenant_id: str
    pool: str
    #: The execution's state now: the attempt's, or DEAD (no attempts left), or CANCELLED (cancel requested).
    state: str
    attempt_state: str
    shard: int
    #: When the next attempt is due, if one was scheduled.
    next_attempt_at: datetime | None

    @property
    def retry(self) -> RetryDue | None:
        return None if self.next_attempt_at is None else RetryDue(self.execution_id, self.next_attempt_at)


@dataclass(frozen=True, slots=True)
class LostAttempt:
    """An attempt the sweeper ends: whose it was (compare-and-swap), why, and the backoff of its retry."""

    execution_id: UUID
    attempt: int
    worker_id: str
    #: FAILED_WORKER_LOST or TIMED_OUT.
    state: str
    error: str
    retry_delay_ms: int


#: Every state an execution can be in (the executions table's CHECK constraint).
EXECUTION_STATES = (
    "PENDING",
    "RUNNING",
    "SUCCEEDED",
    "FAILED",
    "TIMED_OUT",
    "CANCELLED",
    "FAILED_WORKER_LOST",
    "DEAD",
    "SKIPPED",
)


@dataclass(frozen=True, slots=True)
class ExecutionFilter:
    """Which of a tenant's executions to list; None means "any". The time range is on ``scheduled_for``."""

    states: tuple[str, ...] | None = None
    job_id: UUID | None = None
    pool: str | None = None
    handler: str | None = None
    scheduled_from: datetime | None = None
    scheduled_to: datetime | None = None


class ExecutionStore(Protocol):
    """Executions and attempts, read and moved along by the API, the workers and the sweeper."""

    # --- reads and user actions (API)
    async def get_execution(self, tenant_id: str, execution_id: UUID) -> Record | None: ...

    async def execution_attempts(self, execution_id: UUID) -> list[Record]: ...

    async def execution_with_attempts(
        self, tenant_id: str, execution_id: UUID
    ) -> tuple[Record | None, list[Record]]: ...

    async def latest_executions(self, job_id: UUID, limit: int) -> list[Record]: ...

    async def page_executions(self, job_id: UUID, after: tuple[datetime, UUID] | None, limit: int) -> list[Record]: ...

    async def list_executions(
        self, tenant_id: str, where: ExecutionFilter, before: UUID | None, limit: int
    ) -> list[Record]: ...

    async def executions_of_trace(
        self, tenant_id: str, trace_id: str, state: str | None, before: UUID | None, limit: int
    ) -> list[Record]: ...

    async def cancel_execution(self, tenant_id: str, execution_id: UUID, actor: str) -> Record | None: ...

    async def retry_dead_execution(self, tenant_id: str, execution_id: UUID, actor: str) -> Record | None: ...

    # --- attempts (worker)
    async def start_executions(
        self,
        worker_id: str,
        claims: Sequence[tuple[UUID, int]],
        published_at: Sequence[datetime | None] = (),
        launch_at: Sequence[datetime | None] = (),
    ) -> list[Record]: ...

    async def start_executions_as(
        self, claims: Sequence[tuple[UUID, int, str]], published_at: Sequence[datetime | None] = ()
    ) -> list[Record]:
        """``start_executions`` with a worker id per claim (execution id, attempt, worker id)."""
        ...

    async def finish_executions(self, worker_id: str, outcomes: Sequence[Outcome]) -> set[UUID]: ...

    async def warm_starts(self, connections: int) -> None: ...

    async def finish_attempts(self, worker_id: str, outcomes: Sequence[Outcome]) -> list[Finished]: ...

    async def finish_attempts_as(self, outcomes: Sequence[tuple[str, Outcome]]) -> list[Finished]:
        """``finish_attempts`` with a worker id per outcome (worker id, outcome)."""
        ...

    async def attempts_ended_by(self, worker_id: str, outcomes: Sequence[Outcome]) -> dict[UUID, str]:
        """Of these outcomes' attempts, those ``worker_id`` already ended, with the state it recorded."""
        ...

    async def record_progress(self, execution_id: UUID, attempt: int, worker_id: str, progress: Any) -> bool: ...

    async def cancel_requested(self, execution_ids: Sequence[UUID]) -> set[UUID]: ...

    # --- lost attempts and dead letters (sweeper)
    async def running_executions(self, after: tuple[datetime, UUID] | None, limit: int) -> list[Record]: ...

    async def fail_running(self, actor: str, attempts: Sequence[LostAttempt]) -> list[Finished]: ...

    async def dead_letters(self, limit: int) -> list[Record]: ...

    async def mark_dead_lettered(self, execution_ids: Sequence[UUID]) -> None: ...

    async def count_dead(self) -> dict[str, int]: ...

    async def pending_by_pool(
        self, tenant_id: str | None = None, pool: str | None = None
    ) -> dict[str, tuple[int, datetime]]: ...


class PostgresExecutionStore:
    """:class:`ExecutionStore` over the shared pool."""

    def __init__(self, db: Database) -> None:
        self._db = db

    # --- reads and user actions (API) --------------------------------------------------------

    async def get_execution(self, tenant_id: str, execution_id: UUID) -> Record | None:
        return cast(Record | None, await self._db.pool.fetchrow(Q["get_execution"], execution_id, tenant_id))

    async def execution_attempts(self, execution_id: UUID) -> list[Record]:
        return cast(list[Record], await self._db.pool.fetch(Q["execution_attempts"], execution_id))

    async def execution_with_attempts(self, tenant_id: str, execution_id: UUID) -> tuple[Record | None, list[Record]]:
        # One snapshot: a finish writes the execution and its attempt in one transaction, and two separate reads
        # could show the execution CANCELLED beside its attempt still RUNNING.
        async with self._db.pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            execution = await conn.fetchrow(Q["get_execution"], execution_id, tenant_id)
            if execution is None:
                return None, []
            return execution, list(await conn.fetch(Q["execution_attempts"], execution_id))

    async def latest_executions(self, job_id: UUID, limit: int) -> list[Record]:
        return cast(list[Record], await self._db.pool.fetch(Q["latest_executions"], job_id, limit))

    async def page_executions(self, job_id: UUID, after: tuple[datetime, UUID] | None, limit: int) -> list[Record]:
        after_time, after_id = after if after else (None, None)
        return cast(list[Record], await self._db.pool.fetch(Q["page_executions"], job_id, after_time, after_id, limit))

    async def list_executions(
        self, tenant_id: str, where: ExecutionFilter, before: UUID | None, limit: int
    ) -> list[Record]:
        """Up to ``limit`` of the tenant's executions matching ``where``, newest first, with ids below ``before``."""
        rows = await self._db.pool.fetch(
            Q["list_executions"],
            tenant_id,
            list(where.states or EXECUTION_STATES),
            before,
            limit,
            where.job_id,
            where.pool,
            where.handler,
            where.scheduled_from,
            where.scheduled_to,
        )
        return cast(list[Record], rows)

    async def executions_of_trace(
        self, tenant_id: str, trace_id: str, state: str | None, before: UUID | None, limit: int
    ) -> list[Record]:
        return cast(
            list[Record],
            await self._db.pool.fetch(Q["executions_of_trace"], tenant_id, trace_id, before, limit, state),
        )

    async def cancel_execution(self, tenant_id: str, execution_id: UUID, actor: str) -> Record | None:
        """PENDING (or waiting for a retry) → CANCELLED; RUNNING → cancel requested. None: nothing to cancel."""
        return cast(Record | None, await self._db.pool.fetchrow(Q["cancel_execution"], execution_id, tenant_id, actor))

    async def retry_dead_execution(self, tenant_id: str, execution_id: UUID, actor: str) -> Record | None:
        """A DEAD execution gets one more attempt, due now. None: not DEAD, or its retry is already scheduled."""
        return cast(
            Record | None, await self._db.pool.fetchrow(Q["retry_dead_execution"], execution_id, tenant_id, actor)
        )

    # --- attempts (worker) -------------------------------------------------------------------

    async def warm_starts(self, connections: int) -> None:
        """Open ``connections`` of the pool and run the start CAS once on each, for an execution id made now (no
        execution has it, so it changes nothing; rolled back all the same), which the planner prunes to today's
        partitions: those of the first starts to come.

        A Postgres backend's first start CAS pays for the statement's preparation and the backend's first look at
        ``executions``, its partitions and their indexes: 150-280 ms on the loaded test machine, against 7-20 ms
        for the next (the dispatcher's statements, ``PostgresDispatchStore.warm``: 17-25 ms cold, 3-4 warm). A
        worker's pool opened its connections as its first starts came and paid that on the first start of each: a
        burst's first executions and a spread stream's first seconds. Best effort: the caller goes on without it.
        """
        pool = self._db.pool
        held: list[Any] = []
        try:
            for _ in range(connections):  # all held at once: each is a connection of its own
                held.append(await pool.acquire())
            for conn in held:
                transaction = conn.transaction()
                await transaction.start()
                nothing = new_execution_id()
                try:
                    await conn.fetch(Q["start_executions"], [nothing], [1], "warm-up", [None], nothing, nothing, [None])
                finally:
                    await transaction.rollback()
        finally:
            for conn in held:
                await pool.release(conn)

    async def start_executions(
        self,
        worker_id: str,
        claims: Sequence[tuple[UUID, int]],
        published_at: Sequence[datetime | None] = (),
        launch_at: Sequence[datetime | None] = (),
    ) -> list[Record]:
        """PENDING → RUNNING for the given (execution id, attempt) pairs; returns those this worker won.

        ``published_at``: per claim, when its message reached the broker (its Kafka timestamp), if known.
        ``launch_at``: per claim, when its handler will be launched if that is after now (claimed ahead of its due
        instant): its ``started_at``.
        """
        if not claims:
            return []
        sent = list(published_at) or [None] * len(claims)
        launches = list(launch_at) or [None] * len(claims)
        ids = [c[0] for c in claims]
        return cast(
            list[Record],
            await self._db.pool.fetch(
                Q["start_executions"], ids, [c[1] for c in claims], worker_id, sent, min(ids), max(ids), launches
            ),
        )

    async def start_executions_as(
        self, claims: Sequence[tuple[UUID, int, str]], published_at: Sequence[datetime | None] = ()
    ) -> list[Record]:
        """PENDING → RUNNING for claims of several workers in one statement: (execution id, attempt, worker id).

        Each returned row's ``worker_id`` is the worker whose start was accepted; an attempt claimed twice is
        started once.
        """
        if not claims:
            return []
        sent = list(published_at) or [None] * len(claims)
        ids = [c[0] for c in claims]
        return cast(
            list[Record],
            await self._db.pool.fetch(
                Q["start_executions_as"], ids, [c[1] for c in claims], [c[2] for c in claims], sent, min(ids), max(ids)
            ),
        )

    async def finish_executions(self, worker_id: str, outcomes: Sequence[Outcome]) -> set[UUID]:
        """RUNNING → terminal for attempts this worker owns; returns the ids whose write was accepted."""
        return {f.execution_id for f in await self.finish_attempts(worker_id, outcomes)}

    async def attempts_ended_by(self, worker_id: str, outcomes: Sequence[Outcome]) -> dict[UUID, str]:
        if not outcomes:
            return {}
        ids = [o.execution_id for o in outcomes]
        rows = await self._db.pool.fetch(
            Q["attempts_ended_by"], ids, [o.attempt for o in outcomes], min(ids), max(ids), worker_id
        )
        return {row["execution_id"]: row["state"] for row in rows}

    async def finish_attempts(self, worker_id: str, outcomes: Sequence[Outcome]) -> list[Finished]:
        """RUNNING → how each attempt ended, for attempts this worker owns; the accepted ones, with their retry.

        A FAILED or TIMED_OUT attempt with attempts left schedules the next one ``retry_delay_ms`` after the
        database's now; the last one leaves the execution DEAD.
        """
        return await self._finish(Q["finish_executions"], worker_id, outcomes)

    async def finish_attempts_as(self, outcomes: Sequence[tuple[str, Outcome]]) -> list[Finished]:
        """``finish_attempts`` for outcomes of several workers in one statement: (worker id, outcome); each attempt
        is ended only if it is RUNNING under its own outcome's worker."""
        return await self._finish(Q["finish_executions_as"], [w for w, _ in outcomes], [o for _, o in outcomes])

    async def _finish(self, query: str, worker: str | list[str], outcomes: Sequence[Outcome]) -> list[Finished]:
        if not outcomes:
            return []
        ids = [o.execution_id for o in outcomes]
        rows = await self._db.pool.fetch(
            query,
            ids,
            [o.attempt for o in outcomes],
            [o.state for o in outcomes],
            [o.result for o in outcomes],
            [o.error for o in outcomes],
            worker,
            [o.retry_delay_ms for o in outcomes],
            min(ids),
            max(ids),
            [o.traceback for o in outcomes],
            [o.log_tail for o in outcomes],
            [o.started_at for o in outcomes],
            [o.finished_at for o in outcomes],
        )
        return [_finished(row) for row in rows]

    async def record_progress(self, execution_id: UUID, attempt: int, worker_id: str, progress: Any) -> bool:
        row = await self._db.pool.fetchrow(Q["record_progress"], execution_id, attempt, worker_id, progress)
        return row is not None

    async def cancel_requested(self, execution_ids: Sequence[UUID]) -> set[UUID]:
        """Of these RUNNING executions, the ones whose cancel has been requested in Postgres."""
        if not execution_ids:
            return set()
        rows = await self._db.pool.fetch(Q["cancel_requested"], list(execution_ids))
        return {row["id"] for row in rows}

    # --- lost attempts and dead letters (sweeper) --------------------------------------------

    async def running_executions(self, after: tuple[datetime, UUID] | None, limit: int) -> list[Record]:
        """RUNNING executions, oldest first, after the keyset position ``after`` (created_at, id)."""
        after_time, after_id = after if after else (datetime.min.replace(tzinfo=UTC), UUID(int=0))
        return cast(
            list[Record], await self._db.fetch_every_partition(Q["running_executions"], after_time, after_id, limit)
        )

    async def fail_running(self, actor: str, attempts: Sequence[LostAttempt]) -> list[Finished]:
        """End attempts whose worker is gone or that ran past their timeout (CAS on attempt and worker)."""
        if not attempts:
            return []
        ids = [a.execution_id for a in attempts]
        rows = await self._db.pool.fetch(
            Q["fail_running"],
            ids,
            [a.attempt for a in attempts],
            [a.worker_id for a in attempts],
            [a.state for a in attempts],
            [a.error for a in attempts],
            [a.retry_delay_ms for a in attempts],
            actor,
            min(ids),
            max(ids),
        )
        return [_finished(row) for row in rows]

    async def dead_letters(self, limit: int) -> list[Record]:
        return cast(list[Record], await self._db.fetch_every_partition(Q["dead_letters"], limit))

    async def mark_dead_lettered(self, execution_ids: Sequence[UUID]) -> None:
        if execution_ids:
            await self._db.pool.execute(Q["mark_dead_lettered"], list(execution_ids))

    async def count_dead(self) -> dict[str, int]:
        """How many DEAD executions each tenant with jobs has (the sweeper's sampled gauge)."""
        rows = await self._db.pool.fetch(Q["count_dead"])
        return {row["tenant_id"]: row["dead"] for row in rows}

    async def pending_by_pool(
        self, tenant_id: str | None = None, pool: str | None = None
    ) -> dict[str, tuple[int, datetime]]:
        """Executions waiting for a worker, per pool: (how many, creation of the oldest); a tenant's and a pool's
        only when given. A pool without any is absent."""
        rows = await self._db.pool.fetch(Q["pending_by_pool"], tenant_id, pool)
        return {row["pool"]: (row["pending"], row["oldest"]) for row in rows}


def _finished(row: Record) -> Finished:
    return Finished(
        execution_id=row["id"],
        attempt=row["attempt"],
        tenant_id=row["tenant_id"],
        pool=row["pool"],
        state=row["state"],
        attempt_state=row["attempt_state"],
        shard=row["shard"],
        next_attempt_at=row["next_attempt_at"],
    )
