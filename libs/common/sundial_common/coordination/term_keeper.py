"""Keeping one leadership term alive: renewing its lease (or following the process's shared lease), the trust
window, and the guard that ends the term the moment its leader key changes hands (:mod:`.leadership` explains why
each of these is needed)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import aetcd

from sundial_common.coordination.etcd_waits import (
    PERMANENT_ERRORS,
    cancel_watch,
    event_or_quiet,
    first_of,
    within,
)
from sundial_common.coordination.terms import LeadershipConfig, SharedLease, Term
from sundial_common.runtime.clock import Clock

__all__ = ["TermKeeper"]

log = logging.getLogger(__name__)


class TermKeeper:
    """The keepalive of one holder's terms of one shard (a :class:`~.leadership.ShardLeadership` owns one).

    Per term, :meth:`run` is the keepalive task: it renews the term's own lease or follows the process's shared
    ``lease``, records when the last renewal started (:attr:`renewed_at`) and the granted :attr:`ttl`, and marks the
    term lost (``mark_lost``) when it is over; then it frees the key (:meth:`release`), as resigning does.
    """

    def __init__(
        self,
        client: aetcd.Client,
        key: bytes,
        shard: int,
        holder: str,
        config: LeadershipConfig,
        clock: Clock,
        lease: SharedLease | None,
        lost: asyncio.Event,
        mark_lost: Callable[[Term, str], None],
    ) -> None:
        self._client = client
        self._key = key
        self._shard = shard
        self._holder = holder
        self._config = config
        self._clock = clock
        self._lost = lost
        self._lease = lease
        self._mark_lost = mark_lost
        self.ttl = config.ttl_sec  # the granted TTL, if etcd ever grants less than we asked
        self.renewed_at = 0.0  # clock time at which the last successful renewal (or the grant) started
        self._unreachable_since: float | None = None  # fenced terms: when renewals began failing to reach etcd

    def begin(self, renewed_at: float, ttl: float) -> None:
        """A term begins: its lease was granted (or last renewed) at ``renewed_at``, for ``ttl`` seconds."""
        self.ttl = min(self._config.ttl_sec, ttl)
        self.renewed_at = renewed_at
        self._unreachable_since = None

    def trust_deadline(self) -> float:
        return self.renewed_at + self.ttl - self._config.margin_sec

    def trusted(self) -> bool:
        """The term is not lost and (unless fenced) inside its trust window."""
        if self._lost.is_set():
            return False
        return self._config.fenced or self._clock.monotonic() < self.trust_deadline()

    async def run(self, term: Term) -> None:
        """The term's keepalive task: renew its own lease (:meth:`_keep_alive`), or follow the process's lease
        (:meth:`_follow_lease`), until the term ends, while its key guard watches the key; then the key is freed
        at once rather than after the TTL, so a standby (or we) can take over."""
        guard = asyncio.create_task(
            self._guard_key(term), name=f"sundial-leadership-key-guard-shard-{self._shard}-{self._holder}"
        )
        try:
            lease = self._lease
            await (self._keep_alive(term) if lease is None else self._follow_lease(term, lease))
        except asyncio.CancelledError:
            raise  # resign()/stop(): they free the key themselves
        except Exception as exc:
            log.exception("shard %d: keepalive task crashed; giving up the term", self._shard)
            self._mark_lost(term, f"keepalive task crashed: {exc!r}")
        finally:
            guard.cancel()
            await asyncio.wait({guard})
        await self.release(term)

    async def _keep_alive(self, term: Term) -> None:
        """Renew the term's own lease until the term ends."""
        interval = self._config.renew_interval_sec
        fenced = self._config.fenced
        next_renewal = self.renewed_at + interval
        while True:
            wake = next_renewal if fenced else min(next_renewal, self.trust_deadline())
            await first_of(self._clock.sleep(wake - self._clock.monotonic()), self._lost)
            if self._lost.is_set():
                break  # the key guard saw the key change hands (and said so)
            if not self.trusted():
                self._mark_lost(term, "trust window ended before a renewal succeeded")
                break
            started = self._clock.monotonic()
            # A fenced term waits on etcd as long as one call may take; an unfenced one only while trusted.
            budget = self._config.ttl_sec if fenced else self.trust_deadline() - started
            try:
                still_ours = await within(self._renew(term), budget, self._clock)
            except TimeoutError:
                if not fenced:
                    self._mark_lost(term, "renewal did not complete within the trust window")
                    break
                self._unreachable(term, started, "renewal timed out")
                next_renewal = started + interval / 3
                continue
            except PERMANENT_ERRORS:
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
            self.renewed_at = started
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
            self.renewed_at = max(self.renewed_at, lease.renewed_at)
            self.ttl = min(self._config.ttl_sec, lease.ttl)
            if lease.failing_since is not None and self._config.fenced:
                self._unreachable(term, lease.failing_since, "the process's lease renewals fail")
            elif lease.failing_since is None:
                self._reachable(term, self.renewed_at)
            if not self.trusted():
                self._mark_lost(term, "trust window ended before a renewal succeeded")
                break
            if self._config.fenced:
                await first_of(renewal.wait(), self._lost)
            else:
                until_distrust = self.trust_deadline() - self._clock.monotonic()
                await first_of(self._clock.sleep(until_distrust), renewal, self._lost)
            if self._lost.is_set():
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
        created it. Every ``WATCH_RECHECK_SEC`` without an event the key is re-read, so a watch that died
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
                except PERMANENT_ERRORS:
                    raise
                except aetcd.ClientError as exc:
                    # etcd unreachable: the keepalive decides what that does to the term; read again later.
                    log.debug("shard %d: cannot watch the leader key, retrying: %r", self._shard, exc)
                    await self._clock.sleep(self._config.renew_interval_sec)
                try:
                    read_at = await self._holds(term)
                except PERMANENT_ERRORS:
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
                if await event_or_quiet(next_event, self._clock):
                    next_event.result()  # an event (or the watch's error): the key was written or deleted
                    break
                if await self._holds(term) is None:  # quiet for a while: a watch can die silently
                    break
        finally:
            if next_event is not None and not next_event.done():
                next_event.cancel()
            await cancel_watch(watch)
        self._mark_lost(term, "lease expired or the leader key changed hands")

    async def _holds(self, term: Term) -> int | None:
        """The revision of a read that found the key still ``term``'s (its create revision and lease), or None."""
        found = await self._client.get_range(self._key, self._key + b"\0")
        if not found:
            return None
        current = found[0]
        if current.create_revision != term.revision or current.lease != term.lease_id:
            return None
        return int(found.header.revision)

    # -- freeing the key -------------------------------------------------------------------------------

    async def release(self, term: Term) -> None:
        """Free ``term``'s key: revoke its own lease, or delete the key from the process's (if still the term's).

        Best effort: a key on the shared lease that could not be deleted is deleted by this process's next read
        of it (``_cleared_leftover``).
        """
        if self._lease is None:
            await self.revoke_quietly(term.lease_id)
            return
        await self.delete_quietly(term.revision)

    async def delete_quietly(self, create_revision: int) -> None:
        tx = self._client.transactions
        try:
            await within(
                self._client.transaction(
                    compare=[tx.create(self._key) == create_revision], success=[tx.delete(self._key)], failure=[]
                ),
                self._config.ttl_sec,
                self._clock,
            )
        except (aetcd.ClientError, TimeoutError) as exc:
            log.debug("shard %d: deleting the leader key: %r", self._shard, exc)

    async def abandon(self, lease_id: int) -> None:
        """A create that may or may not have been applied: revoke its own lease, or delete the key if it is ours."""
        if self._lease is None:
            await self.revoke_quietly(lease_id)
            return
        with contextlib.suppress(aetcd.ClientError, TimeoutError):
            found = await within(
                self._client.get_range(self._key, self._key + b"\0"), self._config.ttl_sec, self._clock
            )
            if found and found[0].lease == lease_id:
                await self.delete_quietly(int(found[0].create_revision))

    async def revoke_quietly(self, lease_id: int) -> None:
        # Best effort: a lease that already expired is fine, and one we cannot reach expires by itself.
        try:
            await within(self._client.revoke_lease(lease_id), self._config.ttl_sec, self._clock)
        except (aetcd.ClientError, TimeoutError) as exc:
            log.debug("shard %d: revoking lease %d: %r", self._shard, lease_id, exc)
