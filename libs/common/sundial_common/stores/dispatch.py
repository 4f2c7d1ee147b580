"""The dispatch store: what a shard's leader writes under its fence, and the outbox it publishes from.

A leader begins its term by taking the shard (:meth:`PostgresDispatchStore.take_shard`: Postgres issues the
term's fencing token, one more than the last). Each dispatch transaction first raises the shard's fence to
that token (once a newer term has taken the shard it raises :class:`FencedOut`), then creates the executions of
the claimed due occurrences (:meth:`PostgresDispatchStore.occurrence_transaction`: the store locks the due jobs,
the caller decides what to create from them and hands that back as data, the store writes it; no code of the
caller's runs inside the store), or moves claimed retries back to PENDING
(:meth:`PostgresDispatchStore.dispatch_retries`). The execution row is the outbox: the dispatcher marks what it
published, the sweeper republishes what stayed PENDING. The hydrator reads the retries coming due here too,
beside the jobs (:mod:`sundial_common.stores.jobs`).

SQL: ``sql/dispatch.sql``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, TypeVar, cast
from uuid import UUID

import asyncpg

from sundial_common.stores.breakers import gate_retries, hold_first_fires
from sundial_common.stores.database import Database
from sundial_common.stores.queries import load_file
from sundial_common.stores.types import Occurrence, Record, RetryDue, by_shard

Q = load_file("dispatch.sql")
_T = TypeVar("_T")
#: The shard :meth:`PostgresDispatchStore.warm` writes to, in transactions it rolls back.
_NO_SHARD = -1


class FencedOut(Exception):
    """A newer leader has written for this shard: the caller's term is over."""

    def __init__(self, shard: int, token: int) -> None:
        super().__init__(f"shard {shard}: token {token} is fenced out by a newer leader")
        self.shard = shard
        self.token = token


@dataclass(frozen=True, slots=True)
class PlannedExecution:
    """What the dispatcher decided for one locked due job: the execution to create and the job's next fire.

    ``next_fire_at`` is read only when the plan is a plain list (one execution per job, each advancing its
    job there); a :class:`DispatchPlan` carries the jobs' moves separately as :class:`JobAdvance`.
    """

    execution_id: UUID
    #: The locked job's row. The insert reads what the execution inherits from it (tenant, pool, handler, timeout,
    #: priority, shard, its retry policy's ``maxAttempts``) from the jobs table, the same locked version.
    job: Record
    next_fire_at: datetime | None
    #: The dispatch span's W3C traceparent (the row's trace id is its second field).
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
class RetryDispatch:
    """What one retry transaction did: the executions now PENDING (with their payload), and members to put back."""

    dispatched: list[Record]
    #: Claimed members whose retry is scheduled later than claimed, at the score they belong at.
    misplaced: list[RetryDue]
    #: Claims held by an open breaker (among ``misplaced``: they go back at their breaker's next probe).
    held: int = 0
    #: Claims a half-open breaker let through as its probes (among ``dispatched``).
    probes: int = 0


#: Decides, for the locked due jobs, what to create: a plain list (one execution per job, each advancing its
#: job to its ``next_fire_at``) or a full :class:`DispatchPlan`.
Planner = Callable[[Sequence[Record]], list[PlannedExecution] | DispatchPlan]


@dataclass(frozen=True, slots=True)
class ShardClaims:
    """One shard's part of a dispatch transaction: its term's token and the members its pass claimed (and, for
    :meth:`PostgresDispatchStore.dispatch_shards` only, the function that decides its plan)."""

    shard: int
    token: int
    claims: Sequence[Occurrence]
    plan: Planner | None = None


@dataclass(frozen=True, slots=True)
class LockedShard:
    """One shard's part of an open dispatch transaction once its fence is raised and its due jobs are locked."""

    part: ShardClaims
    #: The claimed jobs still due, locked, with their open executions (for the overlap policy): what to plan for.
    due: list[Record]
    #: Claimed members that matched no due job (or whose first fires a breaker holds), where each belongs now.
    misplaced: list[Occurrence]


class DispatchStore(Protocol):
    """Fenced writes of a shard's leader, the retries coming due, and the execution outbox."""

    async def take_shard(self, shard: int, holder: str) -> int: ...

    async def warm(self, connections: int) -> None: ...

    async def dispatch_occurrences(
        self, shard: int, token: int, holder: str, claims: Sequence[Occurrence], plan: Planner
    ) -> DispatchOutcome: ...

    async def dispatch(
        self, shard: int, token: int, holder: str, claims: Sequence[Occurrence], plan: Planner
    ) -> list[PlannedExecution]: ...

    async def dispatch_shards(self, holder: str, parts: Sequence[ShardClaims]) -> list[DispatchOutcome | FencedOut]: ...

    def occurrence_transaction(self, holder: str) -> AbstractAsyncContextManager[OccurrenceTransaction]: ...

    async def dispatch_retries(
        self, shard: int, token: int, holder: str, claims: Sequence[RetryDue]
    ) -> RetryDispatch: ...

    async def shard_fences(self) -> list[Record]: ...

    async def retry_ranges(
        self, after: Mapping[int, RetryDue], end: datetime, limit: int
    ) -> dict[int, list[RetryDue]]: ...

    async def overdue_retries(
        self, shards: Sequence[int], before: datetime, limit: int
    ) -> dict[int, list[RetryDue]]: ...

    async def mark_published(self, execution_ids: Sequence[UUID]) -> None: ...

    async def stale_pending(
        self, unpublished_before: datetime, published_before: datetime, limit: int
    ) -> list[Record]: ...

    async def pending_after(self, after: UUID, limit: int) -> list[Record]: ...

    async def pending_among(self, execution_ids: Sequence[UUID]) -> list[Record]: ...

    async def republished(self, execution_ids: Sequence[UUID]) -> None: ...

    async def published_pending_pools(self) -> dict[str, datetime]: ...

    async def passed_pending(self, pool: str, published_before: datetime, limit: int) -> list[Record]: ...


class PostgresDispatchStore:
    """:class:`DispatchStore` over the shared pool."""

    def __init__(self, db: Database) -> None:
        self._db = db

    # --- terms --------------------------------------------------------------------------------

    async def take_shard(self, shard: int, holder: str) -> int:
        """Begin a term on ``shard`` for ``holder``: the new fencing token, larger than any issued before.

        etcd only elects; the token comes from here so that it never goes backwards, even when etcd is
        rebuilt empty or restored from an old snapshot (its revisions start again). Every write of the term
        then raises the fence to this token (:meth:`dispatch_occurrences`), and the next take fences it out.
        """
        return int(await self._db.pool.fetchval(Q["take_shard"], shard, holder))

    # --- first attempts of due occurrences ---------------------------------------------------

    async def dispatch(
        self,
        shard: int,
        token: int,
        holder: str,
        claims: Sequence[Occurrence],
        plan: Planner,
    ) -> list[PlannedExecution]:
        """:meth:`dispatch_occurrences`, returning only the executions created."""
        return (await self.dispatch_occurrences(shard, token, holder, claims, plan)).created

    async def dispatch_occurrences(
        self,
        shard: int,
        token: int,
        holder: str,
        claims: Sequence[Occurrence],
        plan: Planner,
    ) -> DispatchOutcome:
        """The fenced dispatch transaction of one shard (:meth:`dispatch_shards` with one part): its outcome, or
        :class:`FencedOut`."""
        (outcome,) = await self.dispatch_shards(holder, [ShardClaims(shard, token, claims, plan)])
        if isinstance(outcome, FencedOut):
            raise outcome
        return outcome

    async def dispatch_shards(self, holder: str, parts: Sequence[ShardClaims]) -> list[DispatchOutcome | FencedOut]:
        """The fenced dispatch transaction of one or more shards led by ``holder``, each part's plan decided by its
        ``plan`` function: :meth:`occurrence_transaction`'s two steps with a plain function between them, for callers
        that decide that way (tools, tests). The dispatcher runs the steps itself.

        Per part, in order: its :class:`DispatchOutcome`, or :class:`FencedOut` when a newer term has taken its
        shard (nothing of it is written; the other parts commit). ``plan`` may return a plain list (one execution
        per job, advancing it to ``next_fire_at``) or a :class:`DispatchPlan`.
        """
        results: list[DispatchOutcome | FencedOut] = []
        async with self.occurrence_transaction(holder) as tx:
            locked = await tx.lock(parts)
            decided: list[tuple[LockedShard, list[PlannedExecution] | DispatchPlan]] = []
            for part, lock in zip(parts, locked, strict=True):
                if isinstance(lock, LockedShard):
                    if part.plan is None:
                        raise ValueError(f"shard {part.shard}: dispatch_shards needs each part's plan")
                    decided.append((lock, part.plan(lock.due) if lock.due else DispatchPlan([], [])))
            outcomes = iter(await tx.write(decided))
            for lock in locked:
                results.append(lock if isinstance(lock, FencedOut) else next(outcomes))
        return results

    @contextlib.asynccontextmanager
    async def occurrence_transaction(self, holder: str) -> AsyncIterator[OccurrenceTransaction]:
        """An open dispatch transaction (one occurrence, one execution; every write fenced) of the shards ``holder``
        leads, driven by the caller in two steps: :meth:`OccurrenceTransaction.lock` raises each shard's fence and
        locks its due jobs, the caller decides what to create from them, :meth:`OccurrenceTransaction.write` writes
        that. It commits when the block ends (rolls back if it raises). No code of the caller's runs in the store."""
        async with self._db.pool.acquire() as conn, conn.transaction():
            yield OccurrenceTransaction(conn, holder)

    async def warm(self, connections: int) -> None:
        """Open ``connections`` of the pool and run the dispatch transaction's two statements once on each, with
        nothing to dispatch (a shard that does not exist), rolled back.

        A new connection's first dispatch otherwise pays for the connection itself, the statements' preparation
        and its Postgres backend's first use of the tables, their partitions and the trigger functions (compiled
        once per backend): in a burst of 10,000 due at once the first start waited for that, on the connections
        the burst's concurrent passes open at its due instant. Best effort: a dispatcher without it only starts its
        first burst later.
        """
        pool = self._db.pool
        held: list[asyncpg.pool.PoolConnectionProxy] = []
        try:
            for _ in range(connections):  # all held at once: each is a connection of its own
                held.append(await pool.acquire())
            await asyncio.gather(*(self._warm(conn) for conn in held))
        finally:
            for conn in held:
                await pool.release(conn)

    async def _warm(self, conn: asyncpg.Connection) -> None:
        nothing: list[object] = []
        transaction = conn.transaction()
        await transaction.start()
        try:
            await conn.fetch(Q["lock_due_jobs"], nothing, nothing, [_NO_SHARD], [0], "warm-up", nothing)
            await conn.fetch(Q["insert_executions"], *insert_arguments([], [], {}, "warm-up"))
        finally:
            await transaction.rollback()

    async def shard_fences(self) -> list[Record]:
        """Per shard, the highest token that has written (``shard``, ``token``, ``holder``, ``updated_at``)."""
        return cast(list[Record], await self._db.pool.fetch(Q["shard_fences"]))

    # --- retries ------------------------------------------------------------------------------

    async def retry_ranges(self, after: Mapping[int, RetryDue], end: datetime, limit: int) -> dict[int, list[RetryDue]]:
        """Per shard of ``after``: up to ``limit`` scheduled retries due before ``end``, in (due, id) order strictly
        after the shard's position; one statement for every shard."""
        shards = list(after)
        rows = await self._db.pool.fetch(
            Q["retry_ranges"],
            shards,
            [after[shard].due for shard in shards],
            [after[shard].execution_id for shard in shards],
            end,
            limit,
        )
        return by_shard(shards, rows, _retry_due)

    async def overdue_retries(self, shards: Sequence[int], before: datetime, limit: int) -> dict[int, list[RetryDue]]:
        """Per shard of ``shards``: up to ``limit`` scheduled retries due before ``before`` and still not dispatched
        (their member was lost); one statement for every shard."""
        rows = await self._db.pool.fetch(Q["overdue_retries"], list(shards), before, limit)
        return by_shard(shards, rows, _retry_due)

    async def dispatch_retries(self, shard: int, token: int, holder: str, claims: Sequence[RetryDue]) -> RetryDispatch:
        """The fenced retry transaction: raise the shard's fence to ``token`` (or raise :class:`FencedOut`), then
        move each claimed retry that is due to PENDING with its next attempt. Publishing is the caller's job,
        after commit (the execution row is the outbox, as for a first attempt).
        """
        if not claims:
            return RetryDispatch([], [])
        ids = [c.execution_id for c in claims]
        misplaced: list[RetryDue] = []
        async with self._db.pool.acquire() as conn, conn.transaction():
            if await conn.fetchval(Q["raise_fence"], shard, token, holder) is None:
                raise FencedOut(shard, token)
            # Retries of a handler whose breaker is open are held in this same fenced transaction: a leader
            # change can neither let them out early nor lose them (they come back below as misplaced).
            gate = await gate_retries(conn, ids)
            go = [c for c in claims if c.execution_id not in gate.held]
            rows = await conn.fetch(
                Q["dispatch_retries"], [c.execution_id for c in go], [c.due for c in go], shard, token, holder
            )
            if len(rows) < len(claims):
                done = {row["id"] for row in rows}
                claimed = {c.execution_id: c.due for c in claims}
                later = await conn.fetch(Q["retries_not_due"], [i for i in ids if i not in done], shard)
                misplaced = [
                    RetryDue(row["id"], row["next_attempt_at"])
                    for row in later
                    if row["next_attempt_at"] > claimed[row["id"]]
                ]
        return RetryDispatch(cast(list[Record], rows), misplaced, held=len(gate.held), probes=len(gate.probes))

    # --- the outbox (dispatcher, sweeper) ----------------------------------------------------

    async def mark_published(self, execution_ids: Sequence[UUID]) -> None:
        if execution_ids:
            await self._db.pool.execute(Q["mark_published"], list(execution_ids))

    async def stale_pending(self, unpublished_before: datetime, published_before: datetime, limit: int) -> list[Record]:
        """PENDING executions never published since before ``unpublished_before``, or published before
        ``published_before`` and never started: the sweeper sends them again."""
        return cast(
            list[Record],
            await self._db.fetch_every_partition(Q["stale_pending"], unpublished_before, published_before, limit),
        )

    async def pending_after(self, after: UUID, limit: int) -> list[Record]:
        """Up to ``limit`` PENDING executions with ids after ``after`` (id order), with their payloads: what
        the sweeper sends again when the broker restarted empty."""
        return cast(list[Record], await self._db.pool.fetch(Q["pending_after"], after, limit))

    async def pending_among(self, execution_ids: Sequence[UUID]) -> list[Record]:
        """Those of ``execution_ids`` still PENDING, as :meth:`pending_after` returns them."""
        return cast(list[Record], await self._db.pool.fetch(Q["pending_among"], list(execution_ids)))

    async def republished(self, execution_ids: Sequence[UUID]) -> None:
        if execution_ids:
            await self._db.pool.execute(Q["republished"], list(execution_ids))

    async def published_pending_pools(self) -> dict[str, datetime]:
        """Per pool with PENDING executions published and not started, the oldest such ``published_at``."""
        return {r["pool"]: r["oldest"] for r in await self._db.fetch_every_partition(Q["published_pending_pools"])}

    async def passed_pending(self, pool: str, published_before: datetime, limit: int) -> list[Record]:
        """The pool's PENDING executions published before ``published_before``, as :meth:`stale_pending` returns
        them: their messages were passed by the pool's consumer group without a start."""
        return cast(
            list[Record], await self._db.fetch_every_partition(Q["passed_pending"], pool, published_before, limit)
        )


def _retry_due(row: Record) -> RetryDue:
    return RetryDue(row["id"], row["next_attempt_at"])


def insert_arguments(
    planned: Sequence[PlannedExecution],
    advances: Sequence[JobAdvance],
    tokens: Mapping[int, int],
    holder: str,
) -> list[object]:
    """The parameters of ``insert_executions``, in its order: what each execution has of its own (what it inherits
    from its job, Postgres reads from the locked job), the transaction's shards with their tokens, the jobs'
    moves, the actor. A column whose every value is its default goes as an empty array (:func:`_unless_all`)."""
    return [
        [p.execution_id for p in planned],
        [p.job["id"] for p in planned],
        [p.nominal for p in planned],
        [p.due for p in planned],
        _unless_all([p.state for p in planned], "PENDING"),
        _unless_all([p.triggered for p in planned], False),
        _unless_all([p.note for p in planned], None),
        [p.traceparent for p in planned],
        list(tokens),
        list(tokens.values()),
        [a.job_id for a in advances],
        [a.prev_fire_at for a in advances],
        _unless_all([a.next_fire_at for a in advances], None),
        _unless_all([a.next_nominal_at for a in advances], None),
        _unless_all([a.runs for a in advances], 1),
        _unless_all([a.missed for a in advances], 0),
        _unless_all([a.advance for a in advances], True),
        _unless_all([a.trigger_done for a in advances], False),
        holder,
    ]


def _unless_all(values: list[_T], default: _T) -> list[_T]:
    """``values``, or an empty list when each is ``default``: ``insert_executions`` unnests its arrays together, so a
    shorter one is padded with NULLs, which it reads as the column's default. asyncpg encodes each element of an
    array in Python (~0.2 µs each); in the common case 9 of an execution's 16 are defaults."""
    return [] if values.count(default) == len(values) else values


async def _not_due(conn: asyncpg.Connection, part: ShardClaims, matched: set[UUID]) -> list[Occurrence]:
    """The part's claimed members that matched no due job and belong later: where their job's member belongs now
    (a member that raced ahead of a re-schedule goes back at the right score, not after the overdue scan)."""
    unmatched = [c for c in part.claims if c.job_id not in matched]
    rows = await conn.fetch(
        Q["claimed_but_not_due"], [c.job_id for c in unmatched], [c.due for c in unmatched], part.shard
    )
    return [
        Occurrence(row["id"], row["belongs_at"])
        for row in rows
        if row["belongs_at"] is not None and row["belongs_at"] > row["claimed_due"]
    ]


async def with_open_executions(conn: asyncpg.Connection, due: list[Record]) -> list[Record]:
    """The locked due jobs with ``open_execution_ids`` and ``open_execution_states`` filled in: each job's
    executions still PENDING or RUNNING, oldest first, for its overlap policy. Only jobs whose policy is not
    ALLOW are looked up, in one statement; a batch without such jobs (the default) costs nothing."""
    overlapping = [row["id"] for row in due if row["overlap_policy"] != "ALLOW"]
    if not overlapping:
        return due
    found = {row["job_id"]: row for row in await conn.fetch(Q["open_executions_of_jobs"], overlapping)}
    return [
        {**row, "open_execution_ids": found[row["id"]]["ids"], "open_execution_states": found[row["id"]]["states"]}
        if row["id"] in found
        else row
        for row in due
    ]


class OccurrenceTransaction:
    """One open dispatch transaction (:meth:`PostgresDispatchStore.occurrence_transaction`): lock, then write.

    In the common case that is two statements between BEGIN and COMMIT, whatever the number of shards and claims:
    the fences with the locks, then the executions with the jobs' moves. Publishing and Redis writes are the
    caller's, after commit.
    """

    def __init__(self, conn: asyncpg.Connection, holder: str) -> None:
        self._conn = conn
        self._holder = holder
        self._tokens: dict[int, int] = {}

    async def lock(self, parts: Sequence[ShardClaims]) -> list[LockedShard | FencedOut]:
        """Raise each part's shard fence to its token and lock the claimed jobs that are due (with their open
        executions); per part, in order, its :class:`LockedShard` or :class:`FencedOut` (a newer term has taken its
        shard: checked by the first statement, before anything of it is locked). Parts must be of distinct shards.
        """
        results: list[LockedShard | FencedOut] = [LockedShard(part, [], []) for part in parts]
        live = [i for i, part in enumerate(parts) if part.claims]
        if not live:
            return results
        claims = [(c, parts[i].shard) for i in live for c in parts[i].claims]
        shards = [parts[i].shard for i in live]
        if len(set(shards)) < len(shards):
            raise ValueError(f"one dispatch transaction per shard at a time, got shards {shards}")
        conn = self._conn
        locked = await conn.fetch(
            Q["lock_due_jobs"],
            [c.job_id for c, _ in claims],
            [c.due for c, _ in claims],
            shards,
            [parts[i].token for i in live],
            self._holder,
            [shard for _, shard in claims],
        )
        raised = {row["raised_shard"] for row in locked}
        due_all = await with_open_executions(conn, [row for row in locked if row["id"] is not None])
        # Jobs that chose to hold their first fires while their handler's breaker is open fire later.
        held = await hold_first_fires(conn, due_all)
        for i in live:
            part = parts[i]
            if part.shard not in raised:
                results[i] = FencedOut(part.shard, part.token)
                continue
            self._tokens[part.shard] = part.token
            due = [row for row in due_all if row["shard"] == part.shard]
            misplaced: list[Occurrence] = []
            if len(due) < len(part.claims):
                misplaced = await _not_due(conn, part, {row["id"] for row in due})
            if held:
                misplaced += [Occurrence(row["id"], held[row["id"]]) for row in due if row["id"] in held]
                due = [row for row in due if row["id"] not in held]
            results[i] = LockedShard(part, due, misplaced)
        return results

    async def write(
        self, decided: Sequence[tuple[LockedShard, list[PlannedExecution] | DispatchPlan]]
    ) -> list[DispatchOutcome]:
        """Write what the caller decided for each locked shard: insert the executions (unique per occurrence),
        advance the jobs with compare-and-set, cancel what CANCEL_RUNNING replaces; per shard, in order, what was
        committed.

        A plan may be a plain list (one execution per job, advancing it to ``next_fire_at``); a :class:`DispatchPlan`
        must have a move for the job of each of its executions (``advance=False`` leaves the schedule as it is): the
        insert reads what an execution inherits from its job through that move.
        """
        plans: list[DispatchPlan] = []
        planned: list[PlannedExecution] = []
        advances: list[JobAdvance] = []
        for _, plan in decided:
            if isinstance(plan, list):
                plan = DispatchPlan(
                    plan,
                    [
                        JobAdvance(p.job["id"], p.job["next_fire_at"], p.next_fire_at, p.next_fire_at, runs=1)
                        for p in plan
                    ],
                )
            plans.append(plan)
            planned += plan.executions
            advances += plan.advances
        moved = {a.job_id for a in advances}
        if any(p.job["id"] not in moved for p in planned):  # the insert takes what it inherits from the move
            raise ValueError("a planned execution's job has no move (JobAdvance) in its plan")
        inserted: list[Record] = []
        if planned or advances:
            inserted = await self._conn.fetch(
                Q["insert_executions"], *insert_arguments(planned, advances, self._tokens, self._holder)
            )
        cancel = [execution_id for plan in plans for execution_id in plan.cancel]
        cancelled: list[Record] = []
        if cancel:
            cancelled = await self._conn.fetch(Q["cancel_overlapping"], cancel, self._holder)
        created_ids = {row["id"] for row in inserted}
        running = {row["id"] for row in cancelled if row["state"] == "RUNNING"}
        return [
            DispatchOutcome(
                created=[p for p in plan.executions if p.execution_id in created_ids],
                plan=plan,
                cancel_requested=[execution_id for execution_id in plan.cancel if execution_id in running],
                misplaced=lock.misplaced,
            )
            for (lock, _), plan in zip(decided, plans, strict=True)
        ]
