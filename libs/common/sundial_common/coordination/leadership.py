"""Leadership on etcd leases: which replica may act for a shard (or a singleton role), and until when.

Dispatcher replicas elect one leader per shard with it; the hydrator and the sweeper elect one active
instance each (``run_as_leader``), a "shard" of their own key prefix. It lives in ``sundial_common``
because all three, and the admin view that reads the leader keys, depend on it.

**A term.** Leading a shard means holding the key ``{key_prefix}{shard}/leader`` in etcd, written with
a transaction that succeeds only if the key does not exist (``create_revision == 0``) and attached to a
lease this replica was granted. A term is ``(holder id, revision)``: the revision is the key's
``create_revision``, which tells this holder's key from any later one. It is *not* the fencing token.

**etcd elects, Postgres fences.** The fencing token that guards every write must never go backwards, and
etcd's revisions can: an etcd rebuilt empty (a wiped data directory beside a kept database, a new cluster)
or restored from an old snapshot starts counting again, below the tokens Postgres has recorded, and a
token taken from it would be fenced out for as long as it takes the revisions to catch up. So a leader that
wins the key then *takes the shard* in Postgres (``DispatchStore.take_shard``): one statement raises the
shard's recorded fence by one and returns it as the term's token. Every write of the term raises the fence
to that token and is rejected once a larger one is recorded. A new term can only begin through etcd (the
key must be free: our lease expired or was revoked), and it takes the shard before its first write; from
that moment the old term's writes fail. Postgres serializes the two (the take waits for a write in flight
on the fence row), so per shard the writes are ordered by token, whatever either leader believes.

**One lease per process** (``lease=``, a :class:`SharedLease`: the process's registry entry,
``sundial_common.coordination.registry``). The key is attached to the process's lease, which the registration renews for
all of them; a term grants, renews and revokes nothing of its own. Its keepalive task follows the lease's
renewals instead (the trust window counts from the lease's last renewal), the term ends when the lease
changes (etcd said it expired, or the process deregistered), and resigning *deletes the key* (only if it is
still the term's: its create revision) rather than revoking the lease. A key left behind by a term whose
delete could not reach etcd would live on with the lease, so whoever of this process next reads it
(``acquire``, ``try_acquire``, ``wait_for_vacancy``) deletes it. Without ``lease=`` each term has a lease of
its own, as below.

**Renew only our own term.** The keepalive task refreshes the lease this holder was granted, and a watch
of the key from the term's create revision ends the term the moment anything else writes or deletes it
(re-reading the key every ``WATCH_RECHECK_SEC`` in case the watch died silently). It never touches
anybody else's lease or key: if the key changed hands, our term is over, whatever our lease says.

**The trust window** (unfenced holders: the hydrator's and the sweeper's terms). etcd deletes the key when
the lease has gone ``ttl`` seconds without a renewal, counted from when etcd *received* the renewal. We only
know when we *sent* it, which was earlier, so ``last successful renewal start + ttl`` is a lower bound on the
expiry. We stop acting a margin before that bound: a leader is trusted only while
``now < renewal_start + ttl - margin`` on the monotonic time of the injected clock
(:class:`sundial_common.runtime.clock.Clock`). The margin absorbs
clock-rate drift between machines and the time between checking ``trusted()`` and the write it guards. When
the window ends without a renewal, ``lost`` is set by the keepalive task, which wakes at the window's end
rather than at its next renewal tick.

**A fenced term outlives an unreachable etcd** (``LeadershipConfig.fenced``: the dispatcher's shards). When
renewals fail because etcd does not answer (down, restarting, partitioned from us), a fenced leader keeps
its term and keeps acting, because acting is safe as long as Postgres accepts its fence (see above): if
etcd is down for everyone, nobody else can be elected, and the shards go on being dispatched instead of
stopping until etcd returns; if only we are cut off, etcd expires our lease, another replica is elected and
takes the shard in Postgres, and our next write is fenced out, which ends our term. A fenced term ends when
etcd *answers* that it is over (the lease is gone, the key changed hands), when a write is fenced out, or
on resignation. The trust window would only stop us earlier, at the cost of a dispatch gap for every etcd
hiccup, so it does not apply to fenced terms.

**Standbys watch, they do not poll.** A replica that finds the key taken watches it from the revision
it read, and contends the moment a DELETE arrives (resignation revokes the lease, which deletes the key;
a crashed leader's lease expires). Watching from a known revision means no delete is missed between
the read and the watch; a compacted or broken watch just sends the standby back to re-read the key.

**The database has the last word.** A leader can be paused (GC, SIGSTOP, a slow disk) after checking
``trusted()`` and wake up past its lease, with a successor already dispatching. No client-side check
can close that gap; the fence does: the successor took the shard before writing, so the paused leader's
next write finds a larger token recorded and fails.

**Where it lives.** This module is the election (:class:`ShardLeadership`: acquiring, standing by, resigning) and
:func:`run_as_leader`; what a term is and how leases are sized is :mod:`.terms`; keeping a term alive (renewals,
the trust window, the key guard) and freeing its key is :mod:`.term_keeper`; bounded waits on etcd are
:mod:`.etcd_waits`.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import aetcd

from sundial_common.coordination.etcd_waits import (
    PERMANENT_ERRORS,
    cancel_watch,
    event_or_quiet,
    first_of,
)
from sundial_common.coordination.term_keeper import TermKeeper
from sundial_common.coordination.terms import (
    MIN_TTL_SEC,
    LeadershipConfig,
    LeadershipStopped,
    NoLease,
    SharedLease,
    Term,
)
from sundial_common.runtime.clock import Clock, SystemClock

# The election's names, where its users have always imported them from.
__all__ = [
    "MIN_TTL_SEC",
    "LeadershipConfig",
    "LeadershipStopped",
    "ShardLeadership",
    "SharedLease",
    "Term",
    "cancel_watch",
    "first_of",
    "run_as_leader",
]

log = logging.getLogger(__name__)


class ShardLeadership:
    """Leader election for one shard, for one holder.

    ``acquire()`` blocks until this holder leads and returns the ``Term``; a named keepalive task then
    renews the lease (or, with ``lease=``, follows the process lease's renewals). Do leader-only work
    while ``trusted()``; ``lost`` is set when the term ends (renewal failed, key changed hands, trust
    window ran out, resigned or stopped) and cleared when a new term begins. ``start``/``stop`` (or
    ``async with``) are idempotent; ``stop`` resigns and wakes a standby blocked in ``acquire()`` with
    ``LeadershipStopped``.
    """

    def __init__(
        self,
        client: aetcd.Client,
        shard: int,
        holder: str,
        config: LeadershipConfig | None = None,
        clock: Clock | None = None,
        *,
        lease: SharedLease | None = None,
    ) -> None:
        if isinstance(shard, bool) or not isinstance(shard, int) or shard < 0:
            raise ValueError(f"shard must be a non-negative integer, got {shard!r}")
        if not holder:
            raise ValueError("holder must be a non-empty id naming this replica (e.g. hostname:pid)")
        if lease is not None and clock is not None:
            raise ValueError("a shared lease's renewals are timed on time.monotonic(): no other clock with lease=")
        self._lease = lease
        self._client = client
        self._shard = shard
        self._holder = holder
        self._config = config or LeadershipConfig()
        self._clock: Clock = clock or SystemClock()
        self._key = self._config.leader_key(shard).encode()
        self.lost = asyncio.Event()
        self.lost_reason: str | None = None
        self._term: Term | None = None
        self._keeper = TermKeeper(
            client, self._key, shard, holder, self._config, self._clock, lease, self.lost, self._mark_lost
        )
        self._keepalive: asyncio.Task[None] | None = None
        self._watch: Any = None  # the standby's open aetcd watch, so stop() can end it
        self._started = False
        self._stopped = False

    # -- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._stopped:
            raise LeadershipStopped("a stopped ShardLeadership cannot be restarted; build a new one")
        if not self._started:
            await self._client.connect()
            self._started = True

    async def stop(self) -> None:
        self._stopped = True
        watch, self._watch = self._watch, None
        if watch is not None:
            await cancel_watch(watch)
        await self.resign()

    async def __aenter__(self) -> ShardLeadership:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # -- state ---------------------------------------------------------------------------------------

    @property
    def term(self) -> Term | None:
        """The term this holder leads, or None (never led, lost, resigned or stopped)."""
        return None if self.lost.is_set() else self._term

    def trusted(self) -> bool:
        """True while this holder leads and is inside its trust window (a fenced term: until it is lost)."""
        return self.term is not None and self._keeper.trusted()

    # -- acquiring -----------------------------------------------------------------------------------

    async def acquire(self) -> Term:
        """Block until this holder leads the shard; return the term (the current one if already leading)."""
        await self.start()
        if self.trusted() and self._term is not None:
            return self._term
        await self.resign()  # clear what is left of a lost term (its keepalive task, its lease)
        retry = self._config.renew_interval_sec
        while True:
            if self._stopped:
                raise LeadershipStopped(f"shard {self._shard}: stopped while acquiring")
            try:
                current = await self._client.get(self._key)
                if current is None or await self._cleared_leftover(current):
                    term = await self._try_create()
                    if term is not None:
                        return term
                    continue  # someone else won the race: read again and stand by behind them
                log.debug(
                    "shard %d: led by %r (revision %d); standing by",
                    self._shard,
                    current.value.decode(errors="replace"),
                    current.create_revision,
                )
                await self._await_vacancy(int(current.header.revision))
            except PERMANENT_ERRORS:
                raise
            except aetcd.ClientError as exc:
                log.warning("shard %d: etcd error while acquiring, retrying in %.1fs: %r", self._shard, retry, exc)
                await self._clock.sleep(retry)

    async def try_acquire(self) -> Term | None:
        """One attempt without waiting: lead if the key is vacant, else None (the current term if leading)."""
        await self.start()
        if self.trusted() and self._term is not None:
            return self._term
        await self.resign()
        if self._stopped:
            raise LeadershipStopped(f"shard {self._shard}: stopped")
        current = await self._client.get(self._key)
        if current is not None and not await self._cleared_leftover(current):
            return None
        return await self._try_create()

    async def current_leader(self) -> tuple[str, int] | None:
        """Who leads the shard now, as (holder, revision of its key); None if nobody does."""
        current = await self._client.get(self._key)
        if current is None:
            return None
        return current.value.decode(errors="replace"), int(current.create_revision)

    async def wait_for_vacancy(self) -> int:
        """Block until nobody leads the shard; return an etcd revision at which the key was absent.

        A standby that is not meant to lead right away (see the dispatcher's campaign) uses this to learn
        that a shard was left without a leader, without contending for it yet. The revision lets it
        bring other views of etcd (the replica registry) up to the same point before deciding.
        """
        await self.start()
        retry = self._config.renew_interval_sec
        while True:
            if self._stopped:
                raise LeadershipStopped(f"shard {self._shard}: stopped while waiting for a vacancy")
            try:
                # A range read rather than get(): an absent key still comes with the header's revision.
                found = await self._client.get_range(self._key, self._key + b"\0")
                if not found:
                    return int(found.header.revision)
                if await self._cleared_leftover(found[0]):
                    continue  # read again: the revision of a read without it
                deleted_at = await self._await_vacancy(int(found.header.revision))
                if deleted_at is not None:
                    return deleted_at
            except PERMANENT_ERRORS:
                raise
            except aetcd.ClientError as exc:
                log.warning("shard %d: etcd error while standing by, retrying in %.1fs: %r", self._shard, retry, exc)
                await self._clock.sleep(retry)

    async def _try_create(self) -> Term | None:
        """Create the key on a lease (the process's, or one granted for this term); None if the key was taken."""
        if self._lease is not None:
            if self._lease.lease_id is None:  # being granted again (the last one expired): wait for it a while
                await first_of(self._clock.sleep(self._config.renew_interval_sec), self._lease.renewal())
            lease_id, ttl, started = self._lease.lease_id, self._lease.ttl, self._lease.renewed_at
            if lease_id is None:
                raise NoLease(f"shard {self._shard}: the process's lease is not granted yet")
        else:
            started = self._clock.monotonic()
            granted = await self._client.lease(math.ceil(self._config.ttl_sec))
            lease_id, ttl = granted.id, float(granted.ttl)
        tx = self._client.transactions
        try:
            created, responses = await self._client.transaction(
                compare=[tx.create(self._key) == 0],
                success=[tx.put(self._key, self._holder.encode(), lease=lease_id), tx.get(self._key)],
                failure=[],
            )
        except BaseException:
            # Includes cancellation: the txn may have been applied; do not leave the shard held for a TTL.
            await asyncio.shield(self._keeper.abandon(lease_id))
            raise
        if not created:
            if self._lease is None:
                await self._keeper.revoke_quietly(lease_id)
            return None
        kv = responses[1][0][1]  # the get after the put: (value, Get) pairs
        term = Term(shard=self._shard, holder=self._holder, revision=int(kv.create_revision), lease_id=lease_id)
        if self._stopped:
            await self._keeper.release(term)
            raise LeadershipStopped(f"shard {self._shard}: stopped while acquiring")
        self._term = term
        self._keeper.begin(started, ttl)
        self.lost_reason = None
        self.lost.clear()
        self._keepalive = asyncio.create_task(
            self._keeper.run(term), name=f"sundial-leadership-keepalive-shard-{self._shard}-{self._holder}"
        )
        log.info("shard %d: %r now leads (term revision %d)", self._shard, self._holder, term.revision)
        return term

    async def _await_vacancy(self, seen_revision: int) -> int | None:
        """Return a revision at which the key was absent: a DELETE after ``seen_revision``, or a periodic
        re-read that finds it gone; None if the watch broke or was cancelled (the caller re-reads and watches anew).

        One watch serves the whole wait: every ``WATCH_RECHECK_SEC`` the key is re-read (a watch can die
        silently) but the watch stays. Cancelling it and watching anew at each recheck cost etcd a watch
        create and a cancel per standby every 10 s — 3.6 of its 25 requests a second in an idle ``make up``
        (18 standbys and handover watches) — for the same bound: a vacancy is seen within one recheck.
        """
        watch = await self._client.watch(self._key, start_revision=seen_revision + 1, kind=aetcd.EventKind.DELETE)
        self._watch = watch
        next_event: asyncio.Future[Any] | None = None
        try:
            while not self._stopped:  # stop() may have run while the watch was being created
                if next_event is None:
                    next_event = asyncio.ensure_future(anext(aiter(watch)))
                if await event_or_quiet(next_event, self._clock):
                    return int(next_event.result().kv.mod_revision)
                # Quiet for a while: re-read, so a watch that died silently costs at most this long.
                found = await self._client.get_range(self._key, self._key + b"\0")
                if not found:
                    return int(found.header.revision)
        except StopAsyncIteration:
            pass  # stop() cancelled the watch
        except aetcd.RevisionCompactedError:
            log.info("shard %d: watch history compacted; re-reading the leader key", self._shard)
        finally:
            self._watch = None
            if next_event is not None and not next_event.done():
                next_event.cancel()
            await cancel_watch(watch)
        return None

    def _mark_lost(self, term: Term, reason: str) -> None:
        if self._term is term and not self.lost.is_set():
            self.lost_reason = reason
            self.lost.set()
            log.warning("shard %d: term with revision %d lost: %s", self._shard, term.revision, reason)

    # -- giving up -----------------------------------------------------------------------------------

    async def resign(self) -> None:
        """End the term: stop renewing and revoke the lease (deleting the key). Idempotent."""
        task, self._keepalive = self._keepalive, None
        if task is not None and not task.done():
            task.cancel()
            # wait() rather than `await task`: the task's CancelledError is not ours to swallow or raise,
            # and resign() must still revoke when called from a `finally` in an already-cancelled task.
            await asyncio.wait({task})
        term, self._term = self._term, None
        if term is None:
            return
        if not self.lost.is_set():
            self.lost_reason = "stopped" if self._stopped else "resigned"
            self.lost.set()
        await self._keeper.release(term)
        log.info("shard %d: %r resigned term with revision %d", self._shard, self._holder, term.revision)

    async def _cleared_leftover(self, current: Any) -> bool:
        """True if the key read in ``current`` was a leftover of this process on its shared lease (a term that
        ended without deleting it) and is now deleted; it would otherwise live as long as the process."""
        if self._lease is None or self._lease.lease_id is None or current.lease != self._lease.lease_id:
            return False
        if self._term is not None and self._term.revision == current.create_revision:
            return False  # our live term's key (acquire() and try_acquire() resign a lost one first)
        log.warning("shard %d: deleting a leader key left behind by an earlier term of this process", self._shard)
        await self._keeper.delete_quietly(int(current.create_revision))
        return True


# -- running leader-only work ------------------------------------------------------------------------


async def _set_when_any(target: asyncio.Event, *events: asyncio.Event) -> None:
    await first_of(asyncio.Event().wait(), *events)
    target.set()


async def run_as_leader(
    stop: asyncio.Event,
    leadership: ShardLeadership,
    work: Callable[[asyncio.Event], Awaitable[None]],
    *,
    role: str,
) -> None:
    """Campaign until ``stop``; during each term run ``work(until)``, where ``until`` is set when the term
    ends (lost, trust window over) or the process stops. Then resign and stand by again.

    Leader-only work is grouped here: it is started when a term begins and told to stop
    when it ends, rather than checking ``if leader:`` in every pass. This is for loops that are safe to
    overlap for a moment (every write a compare-and-set), like the hydrator's and the
    sweeper's: a pass that is running when the term ends finishes, and nothing fences it.
    """
    async with leadership:
        while not stop.is_set():
            try:
                term = await first_of(leadership.acquire(), stop)
            except LeadershipStopped:
                return
            if term is None:
                return
            log.info("%s: this replica is now the active one (term revision %d)", role, term.revision)
            until = asyncio.Event()
            relay = asyncio.create_task(_set_when_any(until, stop, leadership.lost), name=f"sundial-{role}-term")
            try:
                await work(until)
            finally:
                relay.cancel()
                await asyncio.wait({relay})
                await leadership.resign()
            if not stop.is_set():
                log.warning("%s: term ended (%s); standing by", role, leadership.lost_reason or "resigned")
