"""One dispatch transaction for the passes of all the shards a dispatcher process leads (group commit).

Each shard a process leads runs its own pass loop (:mod:`sundial_dispatcher.shards`); each pass commits its
claims in a fenced transaction. Committed one by one, a process leading four shards paid four times a pass's
fixed costs in Postgres and here — BEGIN, two statements planned and sent, COMMIT and its WAL flush — for ~30
executions each at a steady 2,500/s. :class:`GroupCommit` is what the shards' passes commit through instead: a pass that
finds no transaction in flight starts one at once, except that it waits for the passes claiming their members at that
moment (a Redis round trip, at most :data:`GATHER_SEC`); passes that come while one is in flight wait for it and
then go together, in one transaction (:func:`commit_parts`: the store locks, each pass's planner decides here,
the store writes). A dense shard passes on a grid its process's shards share (:mod:`sundial_dispatcher.shards`),
so they claim together and commit together: one transaction a tick rather than one a shard.

The invariants hold per shard, as in a transaction of its own: each shard's fence is raised in the shared
transaction by the statement that locks its jobs; a shard that turns out fenced out gets :class:`FencedOut`
and nothing of it is written (its part is dropped before planning), while the others commit; any other failure
fails every pass of the group, and each puts back what it claimed (``ShardDispatcher.run_once``). Publishing
stays each pass's own, after the commit. The transaction runs in a task of its own, so a pass cancelled while
it waits is left out; one cancelled with its transaction in flight only loses the answer: its claims go back
(and match nothing if the transaction commits), and what it committed is the sweeper's to send, as after a crash
between commit and publish.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from sundial_common.stores.dispatch import (
    DispatchOutcome,
    DispatchPlan,
    DispatchStore,
    FencedOut,
    LockedShard,
    PlannedExecution,
    Planner,
    ShardClaims,
)
from sundial_common.stores.types import Occurrence

__all__ = ["GATHER_SEC", "GroupCommit", "OccurrenceCommit", "SoleCommit", "commit_parts", "on_grid"]

#: Longest a transaction about to start waits for the passes still claiming their members (a Redis round trip):
#: passes that woke together (the dense shards' shared grid, ``sundial_dispatcher.shards``) then commit together.
GATHER_SEC = 0.005


def on_grid(wait: float, grid: float, now: float) -> float:
    """``wait`` cut short to end on the grid of ``grid`` seconds of epoch time (``now``), the grid a process's sparse
    shards share: a sparse shard's pass takes what comes due within its gather after the earliest member, so it may
    come earlier, and the sparse shards of a process then pass at the same instants and commit together (at 333
    due a second over four shards a process, one transaction for about four passes instead of one each). Unchanged
    if that grid point has passed already (the pass comes when it was to come), or with no grid."""
    if grid <= 0:
        return wait
    aligned = wait - (now + wait) % grid
    return aligned if aligned > 0 else wait


class OccurrenceCommit(Protocol):
    """How a shard's pass commits its claims: a transaction of its own (:class:`SoleCommit`), or a
    :class:`GroupCommit`. ``plan`` runs here, between the store's lock and its write."""

    async def dispatch_occurrences(
        self, shard: int, token: int, holder: str, claims: Sequence[Occurrence], plan: Planner
    ) -> DispatchOutcome: ...


async def commit_parts(
    store: DispatchStore, holder: str, parts: Sequence[ShardClaims], plans: Sequence[Planner]
) -> list[DispatchOutcome | FencedOut]:
    """One fenced dispatch transaction of ``parts`` (distinct shards led by ``holder``), driven from here: the store
    locks each part's due jobs, each part's planner (``plans``, in order) decides from them here, and the store
    writes the decisions. Per part, its outcome or :class:`FencedOut` (nothing of it written, the others commit)."""
    results: list[DispatchOutcome | FencedOut] = []
    async with store.occurrence_transaction(holder) as tx:
        locked = await tx.lock(parts)
        decided: list[tuple[LockedShard, list[PlannedExecution] | DispatchPlan]] = [
            (lock, plan(lock.due) if lock.due else DispatchPlan([], []))
            for lock, plan in zip(locked, plans, strict=True)
            if isinstance(lock, LockedShard)
        ]
        outcomes = iter(await tx.write(decided))
        for lock in locked:
            results.append(lock if isinstance(lock, FencedOut) else next(outcomes))
    return results


class SoleCommit:
    """A shard's pass committing in a transaction of its own (a dispatcher without a :class:`GroupCommit`)."""

    def __init__(self, store: DispatchStore) -> None:
        self._store = store

    async def dispatch_occurrences(
        self, shard: int, token: int, holder: str, claims: Sequence[Occurrence], plan: Planner
    ) -> DispatchOutcome:
        (outcome,) = await commit_parts(self._store, holder, [ShardClaims(shard, token, claims)], [plan])
        if isinstance(outcome, FencedOut):
            raise outcome
        return outcome


@dataclass(frozen=True, slots=True)
class _Waiting:
    holder: str
    part: ShardClaims
    plan: Planner
    answer: asyncio.Future[DispatchOutcome]


class GroupCommit:
    """The shards of one process commit their passes through this (see the module docstring)."""

    def __init__(self, store: DispatchStore) -> None:
        self._store = store
        self._waiting: list[_Waiting] = []
        self._running: asyncio.Task[None] | None = None
        #: Passes between the start of their claim and its end (see :meth:`claiming`).
        self._claiming = 0
        self._settled = asyncio.Event()
        #: Transactions run and the passes they carried: how much the shards shared.
        self.transactions = 0
        self.passes = 0

    async def dispatch_occurrences(
        self, shard: int, token: int, holder: str, claims: Sequence[Occurrence], plan: Planner
    ) -> DispatchOutcome:
        """Commit one shard's claimed members (as ``DispatchStore.dispatch_occurrences``), with whatever other
        shards' passes are waiting. Raises :class:`FencedOut` if a newer term has taken ``shard``."""
        answer: asyncio.Future[DispatchOutcome] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiting(holder, ShardClaims(shard, token, claims), plan, answer))
        if self._running is None:
            self._running = asyncio.create_task(self._drain(), name="sundial-dispatch-group-commit")
        return await answer

    @contextlib.contextmanager
    def claiming(self) -> Iterator[None]:
        """Around a pass's claim: a transaction about to start waits for it (up to :data:`GATHER_SEC`), as its
        members will likely join."""
        self._claiming += 1
        try:
            yield
        finally:
            self._claiming -= 1
            if not self._claiming:
                self._settled.set()

    async def _drain(self) -> None:
        """Run transactions until nobody waits: each takes every waiting pass it can (one per shard)."""
        try:
            while self._waiting:
                if self._claiming:
                    self._settled.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(GATHER_SEC):
                            await self._settled.wait()
                    await asyncio.sleep(0)  # the passes whose claim just ended submit theirs
                group = self._next_group()
                if group:
                    await self._commit(group)
        finally:
            self._running = None

    def _next_group(self) -> list[_Waiting]:
        """The waiting passes of the next transaction: one per shard, of one holder, in arrival order."""
        group: list[_Waiting] = []
        rest: list[_Waiting] = []
        shards: set[int] = set()
        for waiting in self._waiting:
            if waiting.answer.done():  # its pass was cancelled while it waited: left out
                continue
            if waiting.part.shard in shards or (group and waiting.holder != group[0].holder):
                rest.append(waiting)
            else:
                group.append(waiting)
                shards.add(waiting.part.shard)
        self._waiting = rest
        return group

    async def _commit(self, group: list[_Waiting]) -> None:
        self.transactions += 1
        self.passes += len(group)
        try:
            outcomes = await commit_parts(
                self._store, group[0].holder, [w.part for w in group], [w.plan for w in group]
            )
        except asyncio.CancelledError:
            for waiting in group:
                waiting.answer.cancel()
            raise
        except Exception as exc:
            for waiting in group:
                if not waiting.answer.done():
                    waiting.answer.set_exception(exc)
            return
        for waiting, outcome in zip(group, outcomes, strict=True):
            if waiting.answer.done():
                continue
            if isinstance(outcome, FencedOut):
                waiting.answer.set_exception(outcome)
            else:
                waiting.answer.set_result(outcome)
