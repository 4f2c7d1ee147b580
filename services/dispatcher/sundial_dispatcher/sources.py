"""One shape for every way a shard leader turns work into executions: claim, commit (plan inside), send.

A leader has four *dispatch sources*: the due occurrences of its jobs, with their manual triggers
(:class:`~sundial_dispatcher.dispatcher.ShardDispatcher`), the scheduled retries claimed with them
(:class:`~sundial_dispatcher.retries.RetryDispatcher`), dependent jobs' fires
(:class:`~sundial_dispatcher.triggers.TriggerDispatcher`) and backfills
(:class:`~sundial_dispatcher.backfills.BackfillDispatcher`). Each implements :class:`DispatchSource`, and
:func:`dispatch_once` runs one pass of any of them, in the order that makes dispatch safe:

1. **Claim** what is due: members taken out of the shard's hot window, or (for sources whose work waits in
   Postgres) the room fair dispatch leaves them. Nothing is written yet.
2. **Commit** one transaction under the shard's fence (a deposed leader's raises ``FencedOut``): the source's
   planner decides, from the rows the transaction locked, which executions to create and how each job, trigger or
   backfill moves on; the store writes exactly that. A commit that fails hands the claim back (:meth:`put_back`),
   so the next pass (of this leader or the next) finds it at once.
3. **Send** the committed executions' messages through the outbox sender
   (:class:`~sundial_common.broker.outbox.OutboxSender`). What cannot be sent stays PENDING and unpublished in the
   outbox, and the sweeper sends it.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

__all__ = ["DispatchSource", "dispatch_once"]

ClaimT = TypeVar("ClaimT")
CommitT = TypeVar("CommitT")
ResultT = TypeVar("ResultT")
ResultT_co = TypeVar("ResultT_co", covariant=True)


class DispatchSource(Protocol[ClaimT, CommitT, ResultT_co]):
    """Work a shard leader turns into executions (see the module docstring)."""

    async def claim(self) -> ClaimT | None:
        """What is due now (None: nothing)."""
        ...

    async def commit(self, claimed: ClaimT) -> CommitT:
        """Plan and write ``claimed`` in one fenced transaction. Raises ``FencedOut`` once a newer term writes."""
        ...

    async def put_back(self, claimed: ClaimT) -> None:
        """A commit of ``claimed`` failed: return it where the next pass finds it (best effort)."""
        ...

    async def send(self, committed: CommitT) -> ResultT_co:
        """Send what :meth:`commit` created; the pass's counts."""
        ...

    def nothing(self) -> ResultT_co:
        """The counts of a pass that claimed nothing."""
        ...


async def dispatch_once(source: DispatchSource[ClaimT, CommitT, ResultT]) -> ResultT:
    """One pass of ``source``: claim, commit (putting the claim back if that fails), send."""
    claimed = await source.claim()
    if claimed is None:
        return source.nothing()
    try:
        committed = await source.commit(claimed)
    except BaseException:
        await source.put_back(claimed)
        raise
    return await source.send(committed)
