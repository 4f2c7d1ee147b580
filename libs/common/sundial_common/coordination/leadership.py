"""Leadership on etcd leases: which replica may act for a shard (or a singleton role), and until when.

Dispatcher replicas elect one leader per shard with it; the hydrator and the sweeper elect one active
instance each (``run_as_leader``), a "shard" of their own key prefix. It lives in ``sundial_common``
because all three, and the admin view that reads the leader keys, depend on it.

**A term.** Leading a shard means holding the key ``{key_prefix}{shard}/leader`` in etcd, written with
a transaction that succeeds only if the key does not exist (``create_revision == 0``) and attached to a
lease this replica was granted. A term is ``(holder id, revision)``: the revision is the key's
``create_revision``, which tells this holder's key from any later one. It is *not* the fencing token.

**etcd elects, Postgres fences.** The fencing token of DESIGN invariant 4 (docs/architecture/design.md)
must never go backwards, and
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
(re-reading the key every ``_STANDBY_RECHECK_SEC`` in case the watch died silently). It never touches
anybody else's lease or key: if the key changed hands, our term is over, whatever our lease says.

**The trust window** (unfenced holders: the hydrator's and the sweeper's terms). etcd deletes the key when
the lease has gone ``ttl`` seconds without a renewal, counted from when etcd *received* the renewal. We only
know when we *sent* it, which was earlier, so ``last successful renewal start + ttl`` is a lower bound on the
expiry. We stop acting a margin before that bound: a leader is trusted only while
``now < renewal_start + ttl - margin`` on a monotonic clock (injected, see ``Clock``). The margin absorbs
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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, TypeVar

import aetcd
import aetcd.exceptions

__all__ = [
    "Clock",
    "LeadershipConfig",
    "LeadershipStopped",
    "MonotonicClock",
    "ShardLeadership",
    "SharedLease",
    "Term",
    "cancel_watch",
    "first_of",
    "run_as_leader",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

MIN_TTL_SEC = 2.0
"""etcd (3.4 defaults) rounds shorter leases up to about 2 s; a shorter ttl would make our trust window a lie."""

# A standby, and a leader's key guard, re-read the key this often even without a watch event: a watch
# stream can die silently (a network partition without a reset), and neither must wait forever on it.
_STANDBY_RECHECK_SEC = 10.0

# Longest wait for etcd to take a watch's cancel request (see cancel_watch).
_CANCEL_WATCH_SEC = 1.0

# Errors that are the caller's configuration, not etcd's weather: retrying them would loop forever.
_PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    aetcd.InvalidArgumentError,
    aetcd.exceptions.UnauthenticatedError,
)


class Clock(Protocol):
    """Monotonic time and sleeping on it; tests inject a fake to move time without waiting."""

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """The real clock: ``time.monotonic`` and ``asyncio.sleep``."""

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class SharedLease(Protocol):
    """The process's lease, renewed by its owner for every key on it (``ReplicaRegistration``).

    ``lease_id`` is None while there is none (registering, deregistered); ``renewed_at`` is the
    ``time.monotonic()`` at which its last successful renewal (or grant) started; ``ttl`` is as granted;
    ``failing_since`` the ``time.monotonic()`` since which its renewals fail (None: the last one succeeded).
    """

    lease_id: int | None
    renewed_at: float
    ttl: float
    failing_since: float | None

    def renewal(self) -> asyncio.Event:
        """An event set when the next renewal ends (succeeds or fails) or the lease changes."""
        ...


class NoLease(aetcd.ClientError):  # type: ignore[misc]  # aetcd ships no type information
    """The process's shared lease is not granted (yet): retried like any etcd error."""


class LeadershipStopped(Exception):
    """``acquire()`` was called on, or interrupted by, a stopped ``ShardLeadership``."""


@dataclass(frozen=True)
class Term:
    """One holder's leadership of one shard. ``revision`` is the leader key's create revision (not a fencing
    token: see the module docstring)."""

    shard: int
    holder: str
    revision: int
    lease_id: int


@dataclass(frozen=True)
class LeadershipConfig:
    """How leases are sized and where leader keys live.

    ttl_sec: lease time-to-live; a crashed leader is replaced after at most about this long.
        At least 2.0 (etcd's minimum lease). Renewals happen every ``ttl_sec / 3``.
    margin_sec: how long before the earliest possible lease expiry a leader stops trusting itself.
        Must leave a trust window (``ttl_sec - margin_sec``) longer than the renewal interval.
    key_prefix: etcd prefix of the leader keys; the key of shard N is ``f"{key_prefix}{N}/leader"``.
    fenced: the holder's writes are fenced in Postgres (a term's token from ``take_shard``): its term then
        outlives an unreachable etcd and ends only when etcd answers that it is over (module docstring).
    """

    ttl_sec: float = 5.0
    margin_sec: float = 1.0
    key_prefix: str = "/sundial/shards/"
    fenced: bool = False

    def __post_init__(self) -> None:
        for name in ("ttl_sec", "margin_sec"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
        if self.ttl_sec < MIN_TTL_SEC:
            raise ValueError(
                f"ttl_sec must be at least {MIN_TTL_SEC} seconds (etcd silently rounds shorter leases up, "
                f"so the trust window would not match the real lease), got {self.ttl_sec!r}"
            )
        if self.margin_sec <= 0:
            raise ValueError(
                f"margin_sec must be > 0: it covers clock drift and the time between checking "
                f"trusted() and writing, got {self.margin_sec!r}"
            )
        if self.trust_window_sec <= self.renew_interval_sec:
            raise ValueError(
                f"margin_sec={self.margin_sec!r} leaves a trust window of {self.trust_window_sec:.2f} s, "
                f"not longer than the renewal interval ttl_sec/3 = {self.renew_interval_sec:.2f} s: the "
                f"leader would lose trust before it could renew; use margin_sec < "
                f"{self.ttl_sec - self.renew_interval_sec:.2f} or a larger ttl_sec"
            )
        if not isinstance(self.key_prefix, str) or not self.key_prefix.startswith("/"):
            raise ValueError(f"key_prefix must be a string starting with '/', got {self.key_prefix!r}")
        if not self.key_prefix.endswith("/"):
            raise ValueError(
                f"key_prefix must end with '/' so that shard 1's key is not a prefix of shard 10's, "
                f"got {self.key_prefix!r} (did you mean {self.key_prefix + '/'!r}?)"
            )

    @property
    def renew_interval_sec(self) -> float:
        return self.ttl_sec / 3

    @property
    def trust_window_sec(self) -> float:
        return self.ttl_sec - self.margin_sec

    def leader_key(self, shard: int) -> str:
        return f"{self.key_prefix}{shard}/leader"


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
        self._clock: Clock = clock or MonotonicClock()
        self._key = self._config.leader_key(shard).encode()
        self.lost = asyncio.Event()
        self.lost_reason: str | None = None
        self._term: Term | None = None
        self._ttl = self._config.ttl_sec  # the granted TTL, if etcd ever grants less than we asked
        self._renewed_at = 0.0  # clock time at which the last successful renewal (or the grant) started
        self._unreachable_since: float | None = None  # fenced terms: when renewals began failing to reach etcd
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
            await self._cancel_watch(watch)
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
        if self._config.fenced:
            return self.term is not None
        return self.term is not None and self._clock.monotonic() < self._trust_deadline()

    def _trust_deadline(self) -> float:
        return self._renewed_at + self._ttl - self._config.margin_sec

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
            except _PERMANENT_ERRORS:
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
            except _PERMANENT_ERRORS:
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
            await asyncio.shield(self._abandon(lease_id))
            raise
        if not created:
            if self._lease is None:
                await self._revoke_quietly(lease_id)
            return None
        kv = responses[1][0][1]  # the get after the put: (value, Get) pairs
        term = Term(shard=self._shard, holder=self._holder, revision=int(kv.create_revision), lease_id=lease_id)
        if self._stopped:
            await self._release(term)
            raise LeadershipStopped(f"shard {self._shard}: stopped while acquiring")
        self._term = term
        self._ttl = min(self._config.ttl_sec, ttl)
        self._renewed_at = started
        self._unreachable_since = None
        self.lost_reason = None
        self.lost.clear()
        lease = self._lease
        renew = (lambda: self._keep_alive(term)) if lease is None else (lambda: self._follow_lease(term, lease))
        self._keepalive = asyncio.create_task(
            self._keep(term, renew), name=f"sundial-leadership-keepalive-shard-{self._shard}-{self._holder}"
        )
        log.info("shard %d: %r now leads (term revision %d)", self._shard, self._holder, term.revision)
        return term

    async def _await_vacancy(self, seen_revision: int) -> int | None:
        """Return a revision at which the key was absent: a DELETE after ``seen_revision``, or a periodic
        re-read that finds it gone; None if the watch broke or was cancelled (the caller re-reads and watches anew).

        One watch serves the whole wait: every ``_STANDBY_RECHECK_SEC`` the key is re-read (a watch can die
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
                if await self._event_or_quiet(next_event):
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
            await self._cancel_watch(watch)
        return None

    @staticmethod
    async def _cancel_watch(watch: Any) -> None:
        await cancel_watch(watch)

    # -- keeping the term ----------------------------------------------------------------------------

    async def _keep(self, term: Term, renew: Callable[[], Awaitable[None]]) -> None:
        """The term's keepalive task: ``renew`` (:meth:`_keep_alive` or :meth:`_follow_lease`) until the term
        ends, while its key guard watches the key; then the key is freed at once rather than after the TTL, so a
        standby (or we) can take over."""
        guard = asyncio.create_task(
            self._guard_key(term), name=f"sundial-leadership-key-guard-shard-{self._shard}-{self._holder}"
        )
        try:
            await renew()
        except asyncio.CancelledError:
            raise  # resign()/stop(): they free the key themselves
        except Exception as exc:
            log.exception("shard %d: keepalive task crashed; giving up the term", self._shard)
            self._mark_lost(term, f"keepalive task crashed: {exc!r}")
        finally:
            guard.cancel()
            await asyncio.wait({guard})
        await self._release(term)

    async def _keep_alive(self, term: Term) -> None:
        """Renew the term's own lease until the term ends."""
        interval = self._config.renew_interval_sec
        fenced = self._config.fenced
        next_renewal = self._renewed_at + interval
        while True:
            wake = next_renewal if fenced else min(next_renewal, self._trust_deadline())
            await first_of(self._clock.sleep(wake - self._clock.monotonic()), self.lost)
            if self.lost.is_set():
                break  # the key guard saw the key change hands (and said so)
            if not self.trusted():
                self._mark_lost(term, "trust window ended before a renewal succeeded")
                break
            started = self._clock.monotonic()
            # A fenced term waits on etcd as long as one call may take; an unfenced one only while trusted.
            budget = self._config.ttl_sec if fenced else self._trust_deadline() - started
            try:
                still_ours = await self._within(self._renew(term), budget)
            except TimeoutError:
                if not fenced:
                    self._mark_lost(term, "renewal did not complete within the trust window")
                    break
                self._unreachable(term, started, "renewal timed out")
                next_renewal = started + interval / 3
                continue
            except _PERMANENT_ERRORS:
                raise
            except aetcd.ClientError as exc:
                # Transient (etcd restarting, leader election): try again soon. An unfenced term's trust
                # window bounds how long we act without a renewal; a fenced one's fence does.
                if fenced:
                    self._unreachable(term, started, repr(exc))
                else:
                    log.warning("shard %d: lease renewal failed, retrying: %r", self._shard, exc)
                next_renewal = started + interval / 3
                continue
            if not still_ours:
                self._mark_lost(term, "lease expired or the leader key changed hands")
                break
            self._reachable(term, started)
            self._renewed_at = started
            next_renewal = started + interval

    async def _follow_lease(self, term: Term, lease: SharedLease) -> None:
        """The keepalive task of a term on the process's lease: its renewals are the term's.

        The term ends when the lease changes (etcd answered that it expired, or the process deregistered), an
        unfenced term also when its trust window ends without a renewal, and any term when its key guard sees
        the key change hands. A fenced term lives through renewals that fail (see the module docstring).
        """
        while True:
            renewal = lease.renewal()
            if lease.lease_id != term.lease_id:
                self._mark_lost(term, "the process's lease expired or was revoked")
                break
            self._renewed_at = max(self._renewed_at, lease.renewed_at)
            self._ttl = min(self._config.ttl_sec, lease.ttl)
            if lease.failing_since is not None and self._config.fenced:
                self._unreachable(term, lease.failing_since, "the process's lease renewals fail")
            elif lease.failing_since is None:
                self._reachable(term, self._renewed_at)
            if not self.trusted():
                self._mark_lost(term, "trust window ended before a renewal succeeded")
                break
            if self._config.fenced:
                await first_of(renewal.wait(), self.lost)
            else:
                until_distrust = self._trust_deadline() - self._clock.monotonic()
                await first_of(self._clock.sleep(until_distrust), renewal, self.lost)
            if self.lost.is_set():
                break  # the key guard saw the key change hands (and said so)

    def _reachable(self, term: Term, renewed_at: float) -> None:
        """A renewal that started at ``renewed_at`` succeeded: say so if etcd had been unreachable."""
        if self._unreachable_since is not None:
            log.warning(
                "shard %d: etcd answers again after %.1fs; term with revision %d kept",
                self._shard,
                renewed_at - self._unreachable_since,
                term.revision,
            )
            self._unreachable_since = None

    def _unreachable(self, term: Term, since: float, why: str) -> None:
        """A fenced term's renewal could not reach etcd: keep the term (its fence guards its writes)."""
        if self._unreachable_since is None:
            self._unreachable_since = since
            log.warning(
                "shard %d: etcd unreachable (%s); keeping the term with revision %d while Postgres accepts its fence",
                self._shard,
                why,
                term.revision,
            )

    async def _renew(self, term: Term) -> bool:
        """Refresh our lease; True if it is alive (the key guard watches that the key is still ours)."""
        reply = await self._client.refresh_lease(term.lease_id)
        # aetcd reports an expired/unknown lease as TTL 0, not an error.
        return reply is not None and reply.TTL > 0

    async def _guard_key(self, term: Term) -> None:
        """Mark ``term`` lost as soon as its key is written or deleted by anyone else while our lease lives.

        Nothing of ours writes the key during a term (renewals touch only the lease), so any event on a watch
        from the term's create revision means it changed hands: an operator deleted it, and maybe a successor
        created it. Every ``_STANDBY_RECHECK_SEC`` without an event the key is re-read, so a watch that died
        silently costs at most that long. Reading the key after every renewal instead cost etcd a range read
        per term every ``ttl / 3``: 7.2 of its 25 requests a second in an idle ``make up`` (12 terms).
        """
        seen = term.revision
        try:
            while True:
                try:
                    await self._watch_key(term, seen)
                    return  # the key changed hands; the term is marked lost
                except StopAsyncIteration:
                    pass  # the watch was cancelled under us
                except aetcd.RevisionCompactedError:
                    log.info("shard %d: watch history compacted; re-reading the leader key", self._shard)
                except _PERMANENT_ERRORS:
                    raise
                except aetcd.ClientError as exc:
                    # etcd unreachable: the keepalive decides what that does to the term; read again later.
                    log.debug("shard %d: cannot watch the leader key, retrying: %r", self._shard, exc)
                    await self._clock.sleep(self._config.renew_interval_sec)
                try:
                    read_at = await self._holds(term)
                except _PERMANENT_ERRORS:
                    raise
                except aetcd.ClientError:
                    continue  # watch again from what we last saw; the next failure waits a renewal interval
                if read_at is None:
                    self._mark_lost(term, "lease expired or the leader key changed hands")
                    return
                seen = read_at
        except Exception as exc:
            log.exception("shard %d: leader key guard crashed; giving up the term", self._shard)
            self._mark_lost(term, f"leader key guard crashed: {exc!r}")

    async def _watch_key(self, term: Term, seen: int) -> None:
        """Watch the key after revision ``seen`` (when it was still ours) until it changes hands; then mark it."""
        watch = await self._client.watch(self._key, start_revision=seen + 1)
        next_event: asyncio.Future[Any] | None = None
        try:
            while True:
                if next_event is None:
                    next_event = asyncio.ensure_future(anext(aiter(watch)))
                if await self._event_or_quiet(next_event):
                    next_event.result()  # an event (or the watch's error): the key was written or deleted
                    break
                if await self._holds(term) is None:  # quiet for a while: a watch can die silently
                    break
        finally:
            if next_event is not None and not next_event.done():
                next_event.cancel()
            await self._cancel_watch(watch)
        self._mark_lost(term, "lease expired or the leader key changed hands")

    async def _event_or_quiet(self, next_event: asyncio.Future[Any]) -> bool:
        """Wait for a watch's next event, or ``_STANDBY_RECHECK_SEC`` of quiet (then the caller re-reads the key:
        a watch can die silently); True if the event came."""
        timer = asyncio.ensure_future(self._clock.sleep(_STANDBY_RECHECK_SEC))
        try:
            await asyncio.wait({next_event, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
        return next_event.done()

    async def _holds(self, term: Term) -> int | None:
        """The revision of a read that found the key still ``term``'s (its create revision and lease), or None."""
        found = await self._client.get_range(self._key, self._key + b"\0")
        if not found:
            return None
        current = found[0]
        if current.create_revision != term.revision or current.lease != term.lease_id:
            return None
        return int(found.header.revision)

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
        await self._release(term)
        log.info("shard %d: %r resigned term with revision %d", self._shard, self._holder, term.revision)

    async def _release(self, term: Term) -> None:
        """Free ``term``'s key: revoke its own lease, or delete the key from the process's (if still the term's).

        Best effort: a key on the shared lease that could not be deleted is deleted by this process's next read
        of it (``_cleared_leftover``).
        """
        if self._lease is None:
            await self._revoke_quietly(term.lease_id)
            return
        await self._delete_quietly(term.revision)

    async def _delete_quietly(self, create_revision: int) -> None:
        tx = self._client.transactions
        try:
            await self._within(
                self._client.transaction(
                    compare=[tx.create(self._key) == create_revision], success=[tx.delete(self._key)], failure=[]
                ),
                self._config.ttl_sec,
            )
        except (aetcd.ClientError, TimeoutError) as exc:
            log.debug("shard %d: deleting the leader key: %r", self._shard, exc)

    async def _cleared_leftover(self, current: Any) -> bool:
        """True if the key read in ``current`` was a leftover of this process on its shared lease (a term that
        ended without deleting it) and is now deleted; it would otherwise live as long as the process."""
        if self._lease is None or self._lease.lease_id is None or current.lease != self._lease.lease_id:
            return False
        if self._term is not None and self._term.revision == current.create_revision:
            return False  # our live term's key (acquire() and try_acquire() resign a lost one first)
        log.warning("shard %d: deleting a leader key left behind by an earlier term of this process", self._shard)
        await self._delete_quietly(int(current.create_revision))
        return True

    async def _abandon(self, lease_id: int) -> None:
        """A create that may or may not have been applied: revoke its own lease, or delete the key if it is ours."""
        if self._lease is None:
            await self._revoke_quietly(lease_id)
            return
        with contextlib.suppress(aetcd.ClientError, TimeoutError):
            found = await self._within(self._client.get_range(self._key, self._key + b"\0"), self._config.ttl_sec)
            if found and found[0].lease == lease_id:
                await self._delete_quietly(int(found[0].create_revision))

    async def _revoke_quietly(self, lease_id: int) -> None:
        # Best effort: a lease that already expired is fine, and one we cannot reach expires by itself.
        try:
            await self._within(self._client.revoke_lease(lease_id), self._config.ttl_sec)
        except (aetcd.ClientError, TimeoutError) as exc:
            log.debug("shard %d: revoking lease %d: %r", self._shard, lease_id, exc)

    async def _within(self, work: Awaitable[T], seconds: float) -> T:
        """Await ``work``, or raise TimeoutError once ``seconds`` have passed on the injected clock."""
        work_task = asyncio.ensure_future(work)
        timer = asyncio.ensure_future(self._clock.sleep(seconds))
        try:
            await asyncio.wait({work_task, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            if not work_task.done():
                work_task.cancel()
        if not work_task.done():
            raise TimeoutError
        return work_task.result()


async def cancel_watch(watch: Any) -> None:
    """Cancel an aetcd watch, within a deadline.

    aetcd's ``Watch.cancel()`` raises AttributeError once its client is closed (the watcher is gone): the
    watch is dead either way. And it queues the cancel request on a bounded queue *while holding the
    watcher's lock*: when the stream is down (etcd restarting) nothing drains that queue, the put blocks, and
    every task that needs the lock — a new watch, even a cancelled one re-acquiring it — blocks with it. Seen
    after an etcd restart: a shard campaign stuck for good and a dispatcher that could not stop. The
    deadline cancels the put, which releases the lock.
    """
    with contextlib.suppress(AttributeError, aetcd.ClientError, TimeoutError):
        await asyncio.wait_for(watch.cancel(), _CANCEL_WATCH_SEC)


# -- running leader-only work ------------------------------------------------------------------------


async def first_of(work: Awaitable[T], *events: asyncio.Event) -> T | None:
    """``work``'s result, or None (and ``work`` cancelled) if one of ``events`` is set first."""
    work_task = asyncio.ensure_future(work)
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait({work_task, *waiters}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        if not work_task.done():
            work_task.cancel()
            await asyncio.wait({work_task})
    if work_task.cancelled():
        return None
    return work_task.result()


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
    overlap for a moment (every write compare-and-set, DESIGN invariant 3), like the hydrator's and the
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
