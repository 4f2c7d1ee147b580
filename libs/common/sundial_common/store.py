"""The Postgres store: the only source of truth (DESIGN invariant 1).

Every database call a Sundial process makes goes through :class:`Store`; the SQL itself lives in
``sql/queries.sql``. Batches are one round trip each (arrays through ``unnest``), and asyncpg
prepares and caches every statement, so hot paths pay no parse cost.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeAlias, TypeVar, cast
from uuid import UUID

import asyncpg
import orjson

from sundial_common.queries import Q

#: A row as asyncpg returns it (read by column name).
Record: TypeAlias = Mapping[str, Any]
_T = TypeVar("_T")


class FencedOut(Exception):
    """A newer leader has written for this shard: the caller's term is over."""

    def __init__(self, shard: int, token: int) -> None:
        super().__init__(f"shard {shard}: token {token} is fenced out by a newer leader")
        self.shard = shard
        self.token = token


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One due fire of a job, as claimed from the hot window."""

    job_id: UUID
    due: datetime


@dataclass(frozen=True, slots=True)
class PlannedExecution:
    """What the dispatcher decided for one locked due job: the execution to create and the job's next fire.

    ``next_fire_at`` is read only when the plan is a plain list (one execution per job, each advancing its
    job there); a :class:`DispatchPlan` carries the jobs' moves separately as :class:`JobAdvance`.
    """

    execution_id: UUID
    job: Record
    next_fire_at: datetime | None
    max_attempts: int
    trace_id: str | None
    traceparent: str | None
    #: The nominal occurrence (unique per job). Default: the job's due occurrence.
    scheduled_for: datetime | None = None
    #: When it was due to fire after jitter. Default: the job's ``next_fire_at``.
    fire_at: datetime | None = None
    #: PENDING (to publish) or SKIPPED (recorded, never published: the overlap policy said so).
    state: str = "PENDING"
    #: A manual run (``POST /v1/jobs/{id}/trigger``), outside the schedule.
    triggered: bool = False
    #: Why it was skipped, for the execution's ``error`` and the audit log.
    note: str | None = None

    @property
    def nominal(self) -> datetime:
        if self.scheduled_for is not None:
            return self.scheduled_for
        return cast(datetime, self.job.get("next_nominal_at") or self.job["next_fire_at"])

    @property
    def due(self) -> datetime:
        return self.fire_at if self.fire_at is not None else cast(datetime, self.job["next_fire_at"])


@dataclass(frozen=True, slots=True)
class JobAdvance:
    """How one dispatched job moves: to its next occurrence (``advance``) and/or past its pending trigger."""

    job_id: UUID
    #: The next fire the job was locked at (compare-and-set).
    prev_fire_at: datetime | None
    next_fire_at: datetime | None
    next_nominal_at: datetime | None
    #: Runs the schedule started in this transaction (counted against ``max_runs``).
    runs: int = 0
    #: Occurrences that passed beyond the catch-up window without a run of their own.
    missed: int = 0
    advance: bool = True
    trigger_done: bool = False


@dataclass(frozen=True, slots=True)
class DispatchPlan:
    """Everything the planner decided for one batch of locked jobs."""

    executions: list[PlannedExecution]
    advances: list[JobAdvance]
    #: Open executions to cancel (overlap policy CANCEL_RUNNING).
    cancel: list[UUID] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class DispatchOutcome:
    """What one dispatch transaction committed."""

    #: Executions actually inserted (an occurrence that already had one is left out), PENDING and SKIPPED.
    created: list[PlannedExecution]
    plan: DispatchPlan
    #: RUNNING executions asked to stop; their Redis cancel flag is the caller's to set, after commit.
    cancel_requested: list[UUID]
    #: Claimed members that were not due, with the score their job's member belongs at now.
    misplaced: list[Occurrence]


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one attempt ended, as the worker reports it."""

    execution_id: UUID
    attempt: int
    state: str
    result: Any = None
    error: str | None = None
    #: For a FAILED or TIMED_OUT attempt: how long until the next one, if the execution has attempts left.
    retry_delay_ms: int = 0


@dataclass(frozen=True, slots=True)
class RetryDue:
    """A scheduled retry of an execution, as the hot window holds it (member ``r:<execution id>``)."""

    execution_id: UUID
    due: datetime


@dataclass(frozen=True, slots=True)
class Finished:
    """An outcome Postgres accepted: how the attempt ended and what became of the execution."""

    execution_id: UUID
    attempt: int
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


@dataclass(frozen=True, slots=True)
class RetryDispatch:
    """What one retry transaction did: the executions now PENDING (with their payload), and members to put back."""

    dispatched: list[Record]
    #: Claimed members whose retry is scheduled later than claimed, at the score they belong at.
    misplaced: list[RetryDue]


@dataclass(frozen=True, slots=True)
class IdempotentResponse:
    """What a ``POST`` with an Idempotency-Key answered, kept to answer its retries the same way."""

    status_code: int
    headers: dict[str, str]
    body: bytes
    resource_id: UUID | None


async def _init_connection(conn: asyncpg.Connection) -> None:
    # jsonb in binary format is a version byte followed by the JSON text; orjson does the rest.
    await conn.set_type_codec(
        "jsonb",
        schema="pg_catalog",
        encoder=lambda value: b"\x01" + orjson.dumps(value),
        decoder=lambda data: orjson.loads(data[1:]),
        format="binary",
    )


async def _keep_session(conn: asyncpg.Connection) -> None:
    # Called instead of asyncpg's default reset when a connection goes back to the pool. The default
    # runs "SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL" — a second round trip
    # after every single-statement call. Sundial sets no session state (no SET, LISTEN, advisory locks
    # or cursors outside transactions), and asyncpg still rolls back any transaction left open.
    return None


#: Column defaults of a new job when the caller leaves them out (see ``insert_job``).
_JOB_DEFAULTS: dict[str, Any] = {
    "timezone": "UTC",
    "payload": {},
    "retry_policy": {},
    "priority": "NORMAL",
    "state": "ACTIVE",
    "jitter_sec": 0,
    "overlap_policy": "ALLOW",
    "catchup_policy": "FIRE_ONCE",
    "catchup_window_sec": 60,
}


class Store:
    """Typed access to Sundial's tables over one asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    @classmethod
    async def connect(cls, dsn: str, *, min_size: int = 1, max_size: int = 10) -> Store:
        pool = await asyncpg.create_pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            init=_init_connection,
            reset=_keep_session,
            # JIT compiles, at every execution, any plan whose estimated cost passes a threshold, and the
            # estimates of batched statements (unnest()ed arrays against tables whose statistics lag their
            # growth) are guesses. Nothing Sundial runs is analytic enough to win it back.
            # Plans are made for each execution, never cached generic: a generic plan is chosen while
            # executions is nearly empty (a seq scan is then cheapest) and kept as it grows by thousands of
            # rows a second, until autovacuum's next analyze. Bench W3 at 1,000/s measured the batched
            # start and finish at 14 ms a call (a scan of the table) instead of a few primary-key probes.
            server_settings={"jit": "off", "plan_cache_mode": "force_custom_plan", "random_page_cost": "1.1"},
        )
        return cls(pool)

    async def close(self) -> None:
        await self.pool.close()

    async def ping(self) -> None:
        await self.pool.fetchval(Q["ping"])

    # --- jobs (API) -------------------------------------------------------------------------

    async def insert_job(self, values: dict[str, Any], actor: str) -> Record:
        row = await self.pool.fetchrow(Q["insert_job"], *_job_args(values, actor))
        assert row is not None
        return cast(Record, row)

    async def insert_jobs(self, jobs: Sequence[Mapping[str, Any]], actor: str) -> list[Record]:
        """Register many jobs in one round trip; rows come back in the order of ``jobs``.

        Each mapping holds ``jobs`` column values; absent optional columns take the same defaults as
        :meth:`insert_job`.
        """
        if not jobs:
            return []
        rows = [{**_JOB_DEFAULTS, "next_nominal_at": job.get("next_fire_at"), **job} for job in jobs]
        inserted = await self.pool.fetch(Q["insert_jobs"], rows, actor)
        by_id = {row["id"]: row for row in inserted}
        return [cast(Record, by_id[job["id"]]) for job in jobs]

    async def pause_job(self, tenant_id: str, job_id: UUID, actor: str) -> Record | None:
        """ACTIVE → PAUSED; None when the job was not active (or not this tenant's)."""
        return cast(Record | None, await self.pool.fetchrow(Q["pause_job"], job_id, tenant_id, actor))

    async def resume_job(self, tenant_id: str, job_id: UUID, actor: str) -> Record | None:
        """PAUSED → ACTIVE (COMPLETED if it has no occurrence left); None when the job was not paused."""
        return cast(Record | None, await self.pool.fetchrow(Q["resume_job"], job_id, tenant_id, actor))

    async def trigger_job(
        self, tenant_id: str, job_id: UUID, at: datetime, execution_id: UUID, actor: str
    ) -> Record | None:
        """Record a manual run request; None when the job is cancelled, unknown, or already has one pending."""
        return cast(
            Record | None,
            await self.pool.fetchrow(Q["trigger_job"], job_id, tenant_id, at, execution_id, actor),
        )

    async def update_job(
        self, current: Record, values: Mapping[str, Any], actor: str, changed: Sequence[str]
    ) -> Record | None:
        """Write a job's new definition if it is still at ``current``'s version, next fire and state.

        ``values`` holds every definition column (as ``insert_job`` takes them) plus ``next_fire_at``,
        ``next_nominal_at`` and ``state``. None when another writer got there first.
        """
        row = await self.pool.fetchrow(
            Q["update_job"],
            current["id"],
            current["tenant_id"],
            current["version"],
            current["next_fire_at"],
            current["state"],
            values["name"],
            values["type"],
            values.get("schedule"),
            values["timezone"],
            values.get("run_at"),
            values.get("delay_seconds"),
            values["pool"],
            values["handler"],
            values["payload"],
            values["retry_policy"],
            values["timeout_sec"],
            values["priority"],
            values.get("interval_sec"),
            values.get("run_list"),
            values.get("start_at"),
            values.get("end_at"),
            values.get("max_runs"),
            values["jitter_sec"],
            values["overlap_policy"],
            values["catchup_policy"],
            values["catchup_window_sec"],
            values["next_fire_at"],
            values["next_nominal_at"],
            values["state"],
            actor,
            {"changed": list(changed)},
        )
        return cast(Record | None, row)

    async def get_job(self, tenant_id: str, job_id: UUID) -> Record | None:
        return cast(Record | None, await self.pool.fetchrow(Q["get_job"], job_id, tenant_id))

    async def cancel_job(self, tenant_id: str, job_id: UUID, actor: str) -> Record | None:
        """ACTIVE/PAUSED → CANCELLED; None when the job was not cancellable (or not this tenant's)."""
        return cast(Record | None, await self.pool.fetchrow(Q["cancel_job"], job_id, tenant_id, actor))

    async def latest_executions(self, job_id: UUID, limit: int) -> list[Record]:
        return cast(list[Record], await self.pool.fetch(Q["latest_executions"], job_id, limit))

    async def page_executions(self, job_id: UUID, after: tuple[datetime, UUID] | None, limit: int) -> list[Record]:
        after_time, after_id = after if after else (None, None)
        return cast(list[Record], await self.pool.fetch(Q["page_executions"], job_id, after_time, after_id, limit))

    async def get_execution(self, tenant_id: str, execution_id: UUID) -> Record | None:
        return cast(Record | None, await self.pool.fetchrow(Q["get_execution"], execution_id, tenant_id))

    async def execution_attempts(self, execution_id: UUID) -> list[Record]:
        return cast(list[Record], await self.pool.fetch(Q["execution_attempts"], execution_id))

    # --- hot window (hydrator) --------------------------------------------------------------

    async def hydration_range(self, shard: int, after: Occurrence, end: datetime, limit: int) -> list[Occurrence]:
        """Active jobs of ``shard`` due before ``end``, in (due, id) order strictly after ``after``."""
        rows = await self.pool.fetch(Q["hydration_range"], shard, after.due, end, after.job_id, limit)
        return [Occurrence(row["id"], row["next_fire_at"]) for row in rows]

    async def overdue_jobs(self, shard: int, before: datetime, limit: int) -> list[Occurrence]:
        rows = await self.pool.fetch(Q["overdue_jobs"], shard, before, limit)
        return [Occurrence(row["id"], row["next_fire_at"]) for row in rows]

    async def overdue_triggers(self, shard: int, before: datetime, limit: int) -> list[Occurrence]:
        """Manual triggers of ``shard`` still pending since before ``before`` (their member was lost)."""
        rows = await self.pool.fetch(Q["overdue_triggers"], shard, before, limit)
        return [Occurrence(row["id"], row["trigger_at"]) for row in rows]

    # --- dispatch ---------------------------------------------------------------------------

    async def dispatch(
        self,
        shard: int,
        token: int,
        holder: str,
        claims: Sequence[Occurrence],
        plan: Callable[[Sequence[Record]], list[PlannedExecution] | DispatchPlan],
    ) -> list[PlannedExecution]:
        """:meth:`dispatch_occurrences`, returning only the executions created."""
        return (await self.dispatch_occurrences(shard, token, holder, claims, plan)).created

    async def dispatch_occurrences(
        self,
        shard: int,
        token: int,
        holder: str,
        claims: Sequence[Occurrence],
        plan: Callable[[Sequence[Record]], list[PlannedExecution] | DispatchPlan],
    ) -> DispatchOutcome:
        """The fenced dispatch transaction (DESIGN invariants 2 and 4).

        Raises the shard's fence to ``token`` (or raises :class:`FencedOut`), locks the claimed jobs that
        are due in Postgres (with their open executions, for the overlap policy), lets ``plan`` decide the
        executions and each job's move, inserts the executions (unique per occurrence), advances the jobs
        with compare-and-set and cancels what CANCEL_RUNNING replaces — a handful of statements per batch,
        whatever its size. Publishing and Redis writes are the caller's job, after commit.

        ``plan`` may return a plain list (one execution per job, advancing it to ``next_fire_at``).
        """
        empty = DispatchPlan([], [])
        if not claims:
            return DispatchOutcome([], empty, [], [])
        ids = [c.job_id for c in claims]
        dues = [c.due for c in claims]
        misplaced: list[Occurrence] = []
        cancelled: list[Record] = []
        async with self.pool.acquire() as conn, conn.transaction():
            if await conn.fetchval(Q["raise_fence"], shard, token, holder) is None:
                raise FencedOut(shard, token)
            due = await conn.fetch(Q["lock_due_jobs"], ids, dues, shard)
            if len(due) < len(claims):
                matched = {row["id"] for row in due}
                unmatched = [c for c in claims if c.job_id not in matched]
                rows = await conn.fetch(
                    Q["claimed_but_not_due"], [c.job_id for c in unmatched], [c.due for c in unmatched], shard
                )
                misplaced = [
                    Occurrence(row["id"], row["belongs_at"])
                    for row in rows
                    if row["belongs_at"] is not None and row["belongs_at"] > row["claimed_due"]
                ]
            decided = plan(due) if due else empty
            if isinstance(decided, list):
                decided = DispatchPlan(
                    decided,
                    [
                        JobAdvance(p.job["id"], p.job["next_fire_at"], p.next_fire_at, p.next_fire_at, runs=1)
                        for p in decided
                    ],
                )
            planned = decided.executions
            inserted: list[Record] = []
            if planned:
                inserted = await conn.fetch(
                    Q["insert_executions"],
                    [p.execution_id for p in planned],
                    [p.job["tenant_id"] for p in planned],
                    [p.job["id"] for p in planned],
                    [p.nominal for p in planned],
                    [p.job["pool"] for p in planned],
                    [p.job["handler"] for p in planned],
                    [p.max_attempts for p in planned],
                    [p.job["timeout_sec"] for p in planned],
                    shard,
                    token,
                    [p.trace_id for p in planned],
                    [p.traceparent for p in planned],
                    holder,
                    [p.due for p in planned],
                    [p.state for p in planned],
                    [p.triggered for p in planned],
                    [p.note for p in planned],
                )
            advances = decided.advances
            if advances:
                await conn.execute(
                    Q["advance_jobs"],
                    [a.job_id for a in advances],
                    [a.prev_fire_at for a in advances],
                    [a.next_fire_at for a in advances],
                    [a.next_nominal_at for a in advances],
                    [a.runs for a in advances],
                    [a.missed for a in advances],
                    [a.advance for a in advances],
                    [a.trigger_done for a in advances],
                    holder,
                )
            if decided.cancel:
                cancelled = await conn.fetch(Q["cancel_overlapping"], list(decided.cancel), holder)
        created_ids = {row["id"] for row in inserted}
        return DispatchOutcome(
            created=[p for p in planned if p.execution_id in created_ids],
            plan=decided,
            cancel_requested=[row["id"] for row in cancelled if row["state"] == "RUNNING"],
            misplaced=misplaced,
        )

    async def shard_fences(self) -> list[Record]:
        """Per shard, the highest token that has written (``shard``, ``token``, ``holder``, ``updated_at``)."""
        return cast(list[Record], await self.pool.fetch(Q["shard_fences"]))

    async def mark_published(self, execution_ids: Sequence[UUID]) -> None:
        if execution_ids:
            await self.pool.execute(Q["mark_published"], list(execution_ids))

    # --- sweeper ----------------------------------------------------------------------------

    async def stale_pending(self, unpublished_before: datetime, published_before: datetime, limit: int) -> list[Record]:
        return cast(
            list[Record], await self.pool.fetch(Q["stale_pending"], unpublished_before, published_before, limit)
        )

    async def republished(self, execution_ids: Sequence[UUID]) -> None:
        if execution_ids:
            await self.pool.execute(Q["republished"], list(execution_ids))

    # --- worker -----------------------------------------------------------------------------

    async def start_executions(
        self, worker_id: str, claims: Sequence[tuple[UUID, int]], published_at: Sequence[datetime | None] = ()
    ) -> list[Record]:
        """PENDING → RUNNING for the given (execution id, attempt) pairs; returns those this worker won.

        ``published_at``: per claim, when its message reached the broker (its Kafka timestamp), if known.
        """
        if not claims:
            return []
        sent = list(published_at) or [None] * len(claims)
        return cast(
            list[Record],
            await self.pool.fetch(
                Q["start_executions"], [c[0] for c in claims], [c[1] for c in claims], worker_id, sent
            ),
        )

    async def finish_executions(self, worker_id: str, outcomes: Sequence[Outcome]) -> set[UUID]:
        """RUNNING → terminal for attempts this worker owns; returns the ids whose write was accepted."""
        return {f.execution_id for f in await self.finish_attempts(worker_id, outcomes)}

    async def finish_attempts(self, worker_id: str, outcomes: Sequence[Outcome]) -> list[Finished]:
        """RUNNING → how each attempt ended, for attempts this worker owns; the accepted ones, with their retry.

        A FAILED or TIMED_OUT attempt with attempts left schedules the next one ``retry_delay_ms`` after the
        database's now; the last one leaves the execution DEAD.
        """
        if not outcomes:
            return []
        rows = await self.pool.fetch(
            Q["finish_executions"],
            [o.execution_id for o in outcomes],
            [o.attempt for o in outcomes],
            [o.state for o in outcomes],
            [o.result for o in outcomes],
            [o.error for o in outcomes],
            worker_id,
            [o.retry_delay_ms for o in outcomes],
        )
        return [_finished(row) for row in rows]

    async def record_progress(self, execution_id: UUID, attempt: int, worker_id: str, progress: Any) -> bool:
        row = await self.pool.fetchrow(Q["record_progress"], execution_id, attempt, worker_id, progress)
        return row is not None

    async def cancel_requested(self, execution_ids: Sequence[UUID]) -> set[UUID]:
        """Of these RUNNING executions, the ones whose cancel has been requested in Postgres."""
        if not execution_ids:
            return set()
        rows = await self.pool.fetch(Q["cancel_requested"], list(execution_ids))
        return {row["id"] for row in rows}

    # --- retries (hydrator, dispatcher) -------------------------------------------------------

    async def retry_range(self, shard: int, after: RetryDue, end: datetime, limit: int) -> list[RetryDue]:
        """Scheduled retries of ``shard`` due before ``end``, in (due, id) order strictly after ``after``."""
        rows = await self.pool.fetch(Q["retry_range"], shard, after.due, end, after.execution_id, limit)
        return [RetryDue(row["id"], row["next_attempt_at"]) for row in rows]

    async def overdue_retries(self, shard: int, before: datetime, limit: int) -> list[RetryDue]:
        """Scheduled retries of ``shard`` due before ``before`` and still not dispatched (their member was lost)."""
        rows = await self.pool.fetch(Q["overdue_retries"], shard, before, limit)
        return [RetryDue(row["id"], row["next_attempt_at"]) for row in rows]

    async def dispatch_retries(self, shard: int, token: int, holder: str, claims: Sequence[RetryDue]) -> RetryDispatch:
        """The fenced retry transaction: raise the shard's fence to ``token`` (or raise :class:`FencedOut`), then
        move each claimed retry that is due to PENDING with its next attempt. Publishing is the caller's job,
        after commit (the execution row is the outbox, as for a first attempt).
        """
        if not claims:
            return RetryDispatch([], [])
        ids = [c.execution_id for c in claims]
        misplaced: list[RetryDue] = []
        async with self.pool.acquire() as conn, conn.transaction():
            if await conn.fetchval(Q["raise_fence"], shard, token, holder) is None:
                raise FencedOut(shard, token)
            rows = await conn.fetch(Q["dispatch_retries"], ids, [c.due for c in claims], shard, token, holder)
            if len(rows) < len(claims):
                done = {row["id"] for row in rows}
                claimed = {c.execution_id: c.due for c in claims}
                later = await conn.fetch(Q["retries_not_due"], [i for i in ids if i not in done], shard)
                misplaced = [
                    RetryDue(row["id"], row["next_attempt_at"])
                    for row in later
                    if row["next_attempt_at"] > claimed[row["id"]]
                ]
        return RetryDispatch(cast(list[Record], rows), misplaced)

    # --- sweeper: lost and overdue attempts, dead letters -------------------------------------

    async def running_executions(self, after: tuple[datetime, UUID] | None, limit: int) -> list[Record]:
        """RUNNING executions, oldest first, after the keyset position ``after`` (created_at, id)."""
        after_time, after_id = after if after else (datetime.min.replace(tzinfo=UTC), UUID(int=0))
        return cast(list[Record], await self.pool.fetch(Q["running_executions"], after_time, after_id, limit))

    async def fail_running(self, actor: str, attempts: Sequence[LostAttempt]) -> list[Finished]:
        """End attempts whose worker is gone or that ran past their timeout (CAS on attempt and worker)."""
        if not attempts:
            return []
        rows = await self.pool.fetch(
            Q["fail_running"],
            [a.execution_id for a in attempts],
            [a.attempt for a in attempts],
            [a.worker_id for a in attempts],
            [a.state for a in attempts],
            [a.error for a in attempts],
            [a.retry_delay_ms for a in attempts],
            actor,
        )
        return [_finished(row) for row in rows]

    async def dead_letters(self, limit: int) -> list[Record]:
        return cast(list[Record], await self.pool.fetch(Q["dead_letters"], limit))

    async def mark_dead_lettered(self, execution_ids: Sequence[UUID]) -> None:
        if execution_ids:
            await self.pool.execute(Q["mark_dead_lettered"], list(execution_ids))

    async def purge_idempotency_keys(self, limit: int) -> int:
        status = await self.pool.execute(Q["purge_idempotency_keys"], limit)
        return int(status.split()[-1])

    # --- executions (API) ---------------------------------------------------------------------

    async def list_executions_by_state(
        self, tenant_id: str, state: str, before: UUID | None, limit: int
    ) -> list[Record]:
        return cast(list[Record], await self.pool.fetch(Q["list_executions_by_state"], tenant_id, state, before, limit))

    async def cancel_execution(self, tenant_id: str, execution_id: UUID, actor: str) -> Record | None:
        """PENDING (or waiting for a retry) → CANCELLED; RUNNING → cancel requested. None: nothing to cancel."""
        return cast(Record | None, await self.pool.fetchrow(Q["cancel_execution"], execution_id, tenant_id, actor))

    async def retry_dead_execution(self, tenant_id: str, execution_id: UUID, actor: str) -> Record | None:
        """A DEAD execution gets one more attempt, due now. None: not DEAD, or its retry is already scheduled."""
        return cast(Record | None, await self.pool.fetchrow(Q["retry_dead_execution"], execution_id, tenant_id, actor))

    # --- idempotency keys (API) ---------------------------------------------------------------

    async def claim_idempotency_key(
        self, tenant_id: str, key: str, request_hash: bytes, token: UUID, lock_sec: float, ttl_sec: float
    ) -> bool:
        """Take ``key`` for this request (new, expired, or an abandoned claim of the same body)."""
        row = await self.pool.fetchrow(
            Q["claim_idempotency_key"], tenant_id, key, request_hash, token, lock_sec, ttl_sec
        )
        return row is not None

    async def get_idempotency_key(self, tenant_id: str, key: str) -> Record | None:
        return cast(Record | None, await self.pool.fetchrow(Q["get_idempotency_key"], tenant_id, key))

    async def release_idempotency_key(self, tenant_id: str, key: str, token: UUID) -> None:
        await self.pool.execute(Q["release_idempotency_key"], tenant_id, key, token)

    async def insert_job_idempotent(
        self,
        values: dict[str, Any],
        actor: str,
        *,
        key: str,
        token: UUID,
        respond: Callable[[Record], IdempotentResponse],
    ) -> tuple[Record, IdempotentResponse] | None:
        """:meth:`insert_job` and the key's completion in one transaction: the job exists iff the key answers
        with it, so a retry can never create a second one. None (and nothing written) if the claim was taken
        over meanwhile.
        """

        async def insert(conn: asyncpg.Connection) -> Record:
            return cast(Record, await conn.fetchrow(Q["insert_job"], *_job_args(values, actor)))

        return await self._insert_once(values["tenant_id"], key, token, insert, respond)

    async def insert_jobs_idempotent(
        self,
        jobs: Sequence[Mapping[str, Any]],
        actor: str,
        *,
        tenant_id: str,
        key: str,
        token: UUID,
        respond: Callable[[list[Record]], IdempotentResponse],
    ) -> tuple[list[Record], IdempotentResponse] | None:
        """:meth:`insert_jobs` and the key's completion in one transaction (see :meth:`insert_job_idempotent`)."""

        async def insert(conn: asyncpg.Connection) -> list[Record]:
            if not jobs:
                return []
            rows = [{**_JOB_DEFAULTS, "next_nominal_at": job.get("next_fire_at"), **job} for job in jobs]
            by_id = {row["id"]: row for row in await conn.fetch(Q["insert_jobs"], rows, actor)}
            return [cast(Record, by_id[job["id"]]) for job in jobs]

        return await self._insert_once(tenant_id, key, token, insert, respond)

    async def _insert_once(
        self,
        tenant_id: str,
        key: str,
        token: UUID,
        insert: Callable[[asyncpg.Connection], Awaitable[_T]],
        respond: Callable[[_T], IdempotentResponse],
    ) -> tuple[_T, IdempotentResponse] | None:
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                created = await insert(conn)
                response = respond(created)
                completed = await conn.fetchval(
                    Q["complete_idempotency_key"],
                    tenant_id,
                    key,
                    token,
                    response.status_code,
                    response.headers,
                    response.body,
                    response.resource_id,
                )
                if completed is None:
                    raise _ClaimLost  # leaving the block by an exception rolls the insert back
        except _ClaimLost:
            return None
        return created, response


class _ClaimLost(Exception):
    """Rolls back a transaction whose idempotency claim another request took over."""


def _finished(row: Record) -> Finished:
    return Finished(
        execution_id=row["id"],
        attempt=row["attempt"],
        state=row["state"],
        attempt_state=row["attempt_state"],
        shard=row["shard"],
        next_attempt_at=row["next_attempt_at"],
    )


def _job_args(values: Mapping[str, Any], actor: str) -> tuple[Any, ...]:
    """``insert_job``'s parameters, in order, from a job's column values (absent optional ones defaulted)."""
    return (
        values["id"],
        values["tenant_id"],
        values["name"],
        values["type"],
        values.get("schedule"),
        values.get("timezone", "UTC"),
        values.get("run_at"),
        values.get("delay_seconds"),
        values["pool"],
        values["handler"],
        values.get("payload", {}),
        values.get("retry_policy", {}),
        values["timeout_sec"],
        values.get("priority", "NORMAL"),
        values.get("state", "ACTIVE"),
        values["shard"],
        values.get("next_fire_at"),
        values.get("traceparent"),
        actor,
        values.get("interval_sec"),
        values.get("run_list"),
        values.get("start_at"),
        values.get("end_at"),
        values.get("max_runs"),
        values.get("jitter_sec", 0),
        values.get("overlap_policy", "ALLOW"),
        values.get("catchup_policy", "FIRE_ONCE"),
        values.get("catchup_window_sec", 60),
        values.get("next_nominal_at", values.get("next_fire_at")),
    )
