"""The replica registry in etcd: which Sundial processes are alive, and the keys the cluster lives under.

**Registering.** Every long-lived process (dispatcher, hydrator, sweeper, api) puts one key,
``/sundial/replicas/<kind>/<id>``, holding a JSON :class:`ReplicaRecord`, attached to a lease of its own.
:class:`ReplicaRegistration` renews the lease every ``ttl / 3``; the record itself is written once (its
``heartbeat`` is the registration's instant). When it last spoke is the lease's business: the admin view
derives it from the lease's remaining TTL (``sundial_common.coordination.cluster``). Rewriting the record on every
renewal cost etcd a raft write and a WAL fsync per replica every 1.7 s — 5.4 of them a second in an
idle ``make up`` (etcd's /metrics), for a timestamp only that view reads. A replica that dies stops
renewing and etcd deletes its key one TTL later; one that stops gracefully revokes the lease at once.
A replica that was paused past its TTL (SIGSTOP, a long GC) finds its lease gone and registers again.

**One lease per process.** The entry's lease is also the lease of every leader key the process holds
(``ShardLeadership(lease=registration)``: a dispatcher's shards, a hydrator's or sweeper's role): one
keep-alive every ``ttl / 3`` per process instead of one per lease — 21 leases in an idle ``make up`` were 12.6
keep-alives a second, the largest share of etcd's requests. So the entry and the terms live and die together:
a replica killed loses its entry and its shards in one etcd revision. Stopping is two steps for that reason:
``leave()`` deletes the entry (peers see the replica go) while the lease keeps its terms until they resign,
and ``deregister()`` then revokes the lease.

**Membership.** :class:`Membership` is one replica's view of the live replicas of a kind: a read of the
prefix, then a watch from the revision of that read (so no change between the two is missed), with a
periodic re-read in case a watch stream dies silently. Views of different replicas converge within a
watch round trip; the dispatcher's shard placement is a pure function of this view, so replicas agree on
who should lead what as soon as their views agree.

Keys are laid out by :class:`ClusterKeys`, shared with the leadership module's leader keys and the admin
view, so nothing else spells them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import aetcd
import orjson

from sundial_common.coordination.etcd_client import Client
from sundial_common.coordination.leadership import cancel_watch

__all__ = [
    "KINDS",
    "ClusterKeys",
    "LeftRegistry",
    "Membership",
    "ReplicaRecord",
    "ReplicaRegistration",
    "etcd_client",
]

log = logging.getLogger(__name__)

KINDS = ("api", "dispatcher", "hydrator", "sweeper", "replayer", "worker", "analytics")
"""Process kinds a record may name (``worker`` is reserved: workers do not register yet)."""

# How often a view re-reads etcd even without a watch event: a watch stream can die silently (a network
# partition without a reset), and a stale view must not last forever.
_RECHECK_SEC = 10.0


ETCD_CALL_TIMEOUT_SEC = 5
"""Deadline of one etcd call: a partitioned etcd must fail a call (and let the caller retry or stop), not hang it."""


def etcd_client(endpoint: str) -> aetcd.Client:
    """A client for ``host:port`` (``SUNDIAL_ETCD_ENDPOINT``); it connects on first use."""
    host, _, port = endpoint.rpartition(":")
    # Ours renews every lease on one long-lived keep-alive stream (sundial_common.coordination.etcd_client).
    return Client(host=host or "127.0.0.1", port=int(port), timeout=ETCD_CALL_TIMEOUT_SEC)


@dataclass(frozen=True)
class ClusterKeys:
    """Where the cluster lives in etcd. Every key is under ``root`` (one cluster per root)."""

    root: str = "/sundial/"

    def __post_init__(self) -> None:
        if not self.root.startswith("/") or not self.root.endswith("/"):
            raise ValueError(f"root must start and end with '/', got {self.root!r}")

    @property
    def shard_prefix(self) -> str:
        """Prefix of the dispatcher shards' leader keys (``LeadershipConfig.key_prefix``)."""
        return f"{self.root}shards/"

    @property
    def roles_prefix(self) -> str:
        return f"{self.root}roles/"

    def role_prefix(self, role: str) -> str:
        """Prefix of a singleton role's leader key (hydrator, sweeper): its "shard" 0."""
        if not role or "/" in role:
            raise ValueError(f"role must be a non-empty name without '/', got {role!r}")
        return f"{self.roles_prefix}{role}/"

    def successor(self, shard: int) -> bytes:
        """Where the replica that should lead ``shard`` asks its current leader to hand it over."""
        return f"{self.shard_prefix}{shard}/successor".encode()

    def replicas(self, kind: str | None = None) -> bytes:
        return f"{self.root}replicas/{kind}/".encode() if kind else f"{self.root}replicas/".encode()

    def replica(self, kind: str, replica_id: str) -> bytes:
        return self.replicas(kind) + replica_id.encode()


@dataclass(frozen=True)
class ReplicaRecord:
    """What a replica says about itself in the registry. Times are UTC, ISO 8601."""

    id: str
    kind: str
    host: str
    pid: int
    started: str
    heartbeat: str

    @classmethod
    def for_this_process(cls, kind: str, replica_id: str) -> ReplicaRecord:
        if kind not in KINDS:
            raise ValueError(f"unknown replica kind {kind!r}; expected one of {', '.join(KINDS)}")
        if not replica_id or "/" in replica_id:
            raise ValueError(f"replica id must be non-empty and contain no '/', got {replica_id!r}")
        now = _now()
        return cls(id=replica_id, kind=kind, host=socket.gethostname(), pid=os.getpid(), started=now, heartbeat=now)

    def encode(self) -> bytes:
        return orjson.dumps(self.__dict__)

    @classmethod
    def decode(cls, raw: bytes) -> ReplicaRecord:
        data: dict[str, Any] = orjson.loads(raw)
        return cls(
            id=str(data["id"]),
            kind=str(data["kind"]),
            host=str(data.get("host", "")),
            pid=int(data.get("pid", 0)),
            started=str(data.get("started", "")),
            heartbeat=str(data.get("heartbeat", "")),
        )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class LeftRegistry(RuntimeError):
    """``register()`` after (or during) ``deregister()``: a replica that left stays gone."""


class ReplicaRegistration:
    """This process's entry in the registry, kept alive until ``run``'s stop event (or ``deregister``).

    ``register()`` puts the entry and returns the etcd revision of the write (so a caller can bring a
    :class:`Membership` up to it); ``run(stop)`` renews until ``stop`` and then leaves (deletes the entry);
    it belongs in the process's supervised tasks; ``deregister()`` revokes the lease once nothing else of the
    process holds keys on it. ``lease_id`` is the entry's lease, which other keys that must vanish with this
    replica (its leader keys, a shard's successor request) are attached to; it is a
    ``sundial_common.coordination.leadership.SharedLease`` (``renewed_at``, ``ttl``, ``renewal()``).
    """

    def __init__(
        self, client: aetcd.Client, record: ReplicaRecord, *, ttl_sec: float = 5.0, keys: ClusterKeys | None = None
    ) -> None:
        if ttl_sec < 2.0:
            raise ValueError(f"ttl_sec must be at least 2 seconds (etcd's minimum lease), got {ttl_sec!r}")
        self._client = client
        self.record = record
        self.ttl_sec = ttl_sec
        self.keys = keys or ClusterKeys()
        self._key = self.keys.replica(record.kind, record.id)
        self.lease_id: int | None = None
        self.ttl = ttl_sec  # as granted (etcd may grant less than asked)
        self.renewed_at = 0.0  # time.monotonic() at which the lease's last successful renewal (or grant) started
        self.failing_since: float | None = None  # time.monotonic() of the first of the renewals failing now
        self._renewal = asyncio.Event()
        self._left = False
        self._leaving: asyncio.Future[None] | None = None
        self._revoking: asyncio.Future[None] | None = None

    def renewal(self) -> asyncio.Event:
        """An event set when the next renewal ends (succeeds or fails) or the lease changes."""
        return self._renewal

    def _renewed(self) -> None:
        self._renewal.set()
        self._renewal = asyncio.Event()

    async def register(self) -> int:
        """Grant a lease and put the record under it; the revision of the put."""
        if self._left:
            raise LeftRegistry(f"{self.record.kind} replica {self.record.id} has left the registry")
        started = time.monotonic()
        lease = await self._client.lease(math.ceil(self.ttl_sec))
        if self._left:  # leave() ran while the grant was in flight
            await self._client.revoke_lease(lease.id)
            raise LeftRegistry(f"{self.record.kind} replica {self.record.id} has left the registry")
        self.lease_id = lease.id
        self.ttl = min(self.ttl_sec, float(lease.ttl))
        self.renewed_at = started
        self._renewed()
        self.record = replace(self.record, heartbeat=_now())
        put = await self._client.put(self._key, self.record.encode(), lease=lease.id)
        log.info("registered %s replica %s (lease %x)", self.record.kind, self.record.id, lease.id)
        return int(put.header.revision)

    async def run(self, stop: asyncio.Event) -> None:
        """Renew the lease every ``ttl / 3`` (a third of that after a failure; re-registering after a lost
        lease) until ``stop``; then leave the registry (the lease lives on until ``deregister()``)."""
        interval = self.ttl_sec / 3
        wait = interval
        try:
            while not self._left:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
                if stop.is_set():
                    break
                started = time.monotonic()
                try:
                    await asyncio.wait_for(self._renew(), self.ttl_sec)
                    wait = interval
                    self.failing_since = None
                except (aetcd.ClientError, TimeoutError) as exc:
                    if self.failing_since is None:
                        self.failing_since = started
                    self._renewed()
                    # etcd restarting or unreachable: keep trying, sooner (the leader keys on this lease have a
                    # trust window); the entry expires meanwhile, which is the truth (nobody can see us), and
                    # the next success puts it back.
                    log.warning("%s replica %s: registry renewal failed: %r", self.record.kind, self.record.id, exc)
                    wait = interval / 3
        finally:
            await asyncio.shield(self.leave())

    async def _renew(self) -> None:
        lease_id = self.lease_id
        with contextlib.suppress(LeftRegistry):
            if lease_id is None:
                await self.register()
                return
            started = time.monotonic()
            reply = await self._client.refresh_lease(lease_id)
            if reply is None or reply.TTL <= 0:  # expired while we were paused or cut off
                log.warning(
                    "%s replica %s: registry lease expired; registering again", self.record.kind, self.record.id
                )
                self.lease_id = None
                self._renewed()  # the keys on the old lease are gone: their terms end now
                await self.register()
            elif self.lease_id == lease_id:
                self.renewed_at = started
                self.failing_since = None
                self._renewed()

    async def leave(self) -> None:
        """Delete the entry now, so peers see this replica leave at once; the lease stays (and with it any
        leader key still on it, until its term resigns) until ``deregister()`` or its TTL.

        Idempotent, and every caller returns only once the entry is gone (or could not be reached).
        """
        self._left = True
        if self._leaving is None:
            self._leaving = asyncio.ensure_future(self._delete())
        await asyncio.shield(self._leaving)

    async def _delete(self) -> None:
        try:
            await asyncio.wait_for(self._client.delete(self._key), self.ttl_sec)
            log.info("%s replica %s left the registry", self.record.kind, self.record.id)
        except (aetcd.ClientError, TimeoutError) as exc:  # it expires with the lease
            log.debug("deleting registry entry %s: %r", self._key.decode(), exc)

    async def deregister(self) -> None:
        """Leave, and revoke the lease (ending any term still on it): the process is done with etcd.

        Idempotent, and every caller returns only once the lease is gone (or could not be reached).
        """
        self._left = True
        if self._revoking is None:
            self._revoking = asyncio.ensure_future(self._revoke())
        await asyncio.shield(self._revoking)

    async def _revoke(self) -> None:
        lease_id, self.lease_id = self.lease_id, None
        self._renewed()
        if lease_id is None:
            return
        try:
            await asyncio.wait_for(self._client.revoke_lease(lease_id), self.ttl_sec)
            log.info("deregistered %s replica %s", self.record.kind, self.record.id)
        except (aetcd.ClientError, TimeoutError) as exc:  # it expires by itself
            log.debug("revoking registry lease %x: %r", lease_id, exc)


class Membership:
    """The live replicas of one kind, as one replica sees them (see the module docstring).

    ``members`` is the sorted tuple of live ids and ``revision`` the etcd revision the view is current
    to. ``changed()`` returns an event that is set the next time the *set* of members changes (heartbeats
    do not count), so a waiter takes the event, evaluates, then waits on it without missing a change.
    """

    def __init__(self, client: aetcd.Client, kind: str, keys: ClusterKeys | None = None) -> None:
        self._client = client
        self.kind = kind
        self.keys = keys or ClusterKeys()
        self._prefix = self.keys.replicas(kind)
        self.records: dict[str, ReplicaRecord] = {}
        self.members: tuple[str, ...] = ()
        self.revision = 0
        self._changed = asyncio.Event()
        self._refresh_lock = asyncio.Lock()
        # Set when etcd could not be reached: the etcd that answers next may be a rebuilt or restored one,
        # whose revisions start below ours, so the next read is taken whatever its revision.
        self._history_may_restart = False

    def changed(self) -> asyncio.Event:
        return self._changed

    async def refresh(self) -> None:
        """Re-read the whole prefix (linearizable, so the view is at least as new as any write before it)."""
        async with self._refresh_lock:
            found = await self._client.get_prefix(self._prefix)
            revision = int(found.header.revision)
            if revision < self.revision and not self._history_may_restart:
                return  # a watch event already brought us further
            self._history_may_restart = False
            records: dict[str, ReplicaRecord] = {}
            for kv in found:
                record = self._decode(kv.key, kv.value)
                if record is not None:
                    records[record.id] = record
            self.records = records
            self.revision = revision
            self._publish()

    async def catch_up(self, revision: int) -> None:
        """Make the view at least as new as ``revision`` (re-reading if the watch has not got there yet)."""
        if self.revision < revision:
            await self.refresh()

    async def run(self, stop: asyncio.Event) -> None:
        """Keep the view current until ``stop``: read, watch from the read's revision, re-read on trouble."""
        while not stop.is_set():
            try:
                await self.refresh()
                await self._follow(stop)
            except aetcd.RevisionCompactedError:
                log.info("membership watch history compacted; re-reading")
            except aetcd.ClientError as exc:
                log.warning("membership of %s replicas: etcd error, retrying: %r", self.kind, exc)
                self._history_may_restart = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)

    async def _follow(self, stop: asyncio.Event) -> None:
        watch = await self._client.watch_prefix(self._prefix, start_revision=self.revision + 1)
        events = aiter(watch)
        stopping = asyncio.ensure_future(stop.wait())
        next_event: asyncio.Future[Any] | None = None
        try:
            while not stop.is_set():
                if next_event is None:
                    next_event = asyncio.ensure_future(anext(events))
                done, _ = await asyncio.wait(
                    {next_event, stopping}, timeout=_RECHECK_SEC, return_when=asyncio.FIRST_COMPLETED
                )
                if stop.is_set():
                    return
                if next_event not in done:
                    # Quiet for a while: re-read, so a watch stream that died silently costs at most this long.
                    await self.refresh()
                    continue
                try:
                    event = next_event.result()
                except StopAsyncIteration:
                    return  # the watch was cancelled; run() reads again and watches anew
                next_event = None
                self._apply(event)
        finally:
            stopping.cancel()
            if next_event is not None and not next_event.done():
                next_event.cancel()
            await cancel_watch(watch)

    def _apply(self, event: Any) -> None:
        revision = int(event.kv.mod_revision)
        if revision <= self.revision:
            return  # a refresh already covered it
        if event.kind == aetcd.EventKind.DELETE:
            replica_id = event.kv.key[len(self._prefix) :].decode(errors="replace")
            self.records.pop(replica_id, None)
        else:
            record = self._decode(event.kv.key, event.kv.value)
            if record is not None:
                self.records[record.id] = record
        self.revision = revision
        self._publish()

    def _decode(self, key: bytes, value: bytes) -> ReplicaRecord | None:
        try:
            return ReplicaRecord.decode(value)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring malformed registry entry %r: %r", key, exc)
            return None

    def _publish(self) -> None:
        members = tuple(sorted(self.records))
        if members != self.members:
            self.members = members
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
