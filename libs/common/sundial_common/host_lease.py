"""One etcd client and one lease for every service a ``sundial services`` host runs.

Each singleton service keeps its own registry entry (``/sundial/replicas/<kind>/<id>``) and its own leader key,
so who leads which role, and how a standby takes one role over, is what it was. What the services of one host
share is what costs an idle process: the etcd client (its gRPC channel and connection) and the lease those keys
hang on, renewed once every ``ttl / 3`` for all of them. Three services on leases of their own were three
renewal loops, three terms following three leases and three channels: an isolated host of three idle roles took
0.0045 core, 0.0028 on one client and one lease (README "Eleventh round: one lease per services host").

The keys live and die as they did: a host killed loses its entries and its leader keys together one TTL later
(they did before, on three leases expiring at once); a role that resigns deletes its key and keeps the lease for
the others; a lease that expired (the process was paused past its TTL) is granted again and every entry still
registered is put on it again, while the terms on the old one end, as :class:`ReplicaRegistration` does for one
entry. The lease is revoked only once the host is done (:meth:`HostLease.revoke`), after every service resigned
and left.

``HostLease`` is the ``SharedLease`` (``sundial_common.leadership``) of each service's terms; a service's
:class:`HostedRegistration` stands where its :class:`ReplicaRegistration` would (``register``, ``run``,
``deregister``), its entry on the host's lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import replace
from datetime import UTC, datetime

import aetcd

from sundial_common.registry import ClusterKeys, LeftRegistry, ReplicaRecord

__all__ = ["HostLease", "HostedRegistration"]

log = logging.getLogger(__name__)


class HostLease:
    """The lease of a host's registry entries and leader keys; ``run(stop)`` renews it until ``stop``.

    ``lease_id``, ``ttl``, ``renewed_at``, ``failing_since`` and ``renewal()`` are as for a
    :class:`ReplicaRegistration` (``SharedLease``). Entries join with :meth:`entry` and ``register()``.
    """

    def __init__(self, client: aetcd.Client, *, ttl_sec: float, keys: ClusterKeys | None = None) -> None:
        if ttl_sec < 2.0:
            raise ValueError(f"ttl_sec must be at least 2 seconds (etcd's minimum lease), got {ttl_sec!r}")
        self.client = client
        self.ttl_sec = ttl_sec
        self.keys = keys or ClusterKeys()
        self.lease_id: int | None = None
        self.ttl = ttl_sec
        self.renewed_at = 0.0
        self.failing_since: float | None = None
        self._renewal = asyncio.Event()
        self._entries: dict[bytes, ReplicaRecord] = {}
        self._granting = asyncio.Lock()  # one grant at a time, and no put racing a re-grant
        self._revoked = False

    def renewal(self) -> asyncio.Event:
        """An event set when the next renewal ends (succeeds or fails) or the lease changes."""
        return self._renewal

    def _renewed(self) -> None:
        self._renewal.set()
        self._renewal = asyncio.Event()

    def entry(self, record: ReplicaRecord) -> HostedRegistration:
        """A hosted service's registration: ``record`` on this lease."""
        return HostedRegistration(self, record)

    async def _put(self, key: bytes, record: ReplicaRecord) -> int:
        """Put ``record`` at ``key`` on the lease (granting it first if there is none); the put's revision."""
        async with self._granting:
            if self._revoked:
                raise LeftRegistry(f"{record.kind} replica {record.id}: the host's lease was revoked")
            if self.lease_id is None:
                await self._grant()
            assert self.lease_id is not None
            self._entries[key] = record
            put = await self.client.put(key, record.encode(), lease=self.lease_id)
            log.info("registered %s replica %s (host lease %x)", record.kind, record.id, self.lease_id)
            return int(put.header.revision)

    async def _grant(self) -> None:
        """A new lease, with every entry still registered put on it again (the caller holds ``_granting``)."""
        started = time.monotonic()
        lease = await self.client.lease(math.ceil(self.ttl_sec))
        # The entries first: a term sees the new lease only once every entry is on it (a put that fails leaves
        # the lease to expire unused, and the next renewal grants another).
        for key, record in list(self._entries.items()):
            self._entries[key] = record = replace(record, heartbeat=_now())
            await self.client.put(key, record.encode(), lease=lease.id)
            log.info("registered %s replica %s again (host lease %x)", record.kind, record.id, lease.id)
        self.lease_id = lease.id
        self.ttl = min(self.ttl_sec, float(lease.ttl))
        self.renewed_at = started
        self._renewed()

    async def _forget(self, key: bytes) -> None:
        """Delete the entry at ``key`` (it expires with the lease if etcd cannot be reached)."""
        self._entries.pop(key, None)
        try:
            await asyncio.wait_for(self.client.delete(key), self.ttl_sec)
        except (aetcd.ClientError, TimeoutError) as exc:
            log.debug("deleting registry entry %s: %r", key.decode(), exc)

    async def run(self, stop: asyncio.Event) -> None:
        """Renew every ``ttl / 3`` (a third of that after a failure; a new lease after a lost one) until ``stop``."""
        interval = self.ttl_sec / 3
        wait = interval
        while not self._revoked:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)
            if stop.is_set():
                return
            started = time.monotonic()
            try:
                await asyncio.wait_for(self._renew(), self.ttl_sec)
                wait = interval
            except (aetcd.ClientError, TimeoutError) as exc:
                if self.failing_since is None:
                    self.failing_since = started
                self._renewed()
                log.warning("host lease: renewal failed: %r", exc)
                wait = interval / 3

    async def _renew(self) -> None:
        lease_id = self.lease_id
        started = time.monotonic()
        if lease_id is not None:
            reply = await self.client.refresh_lease(lease_id)
            if reply is not None and reply.TTL > 0:
                if self.lease_id == lease_id:
                    self.renewed_at = started
                    self.failing_since = None
                    self._renewed()
                return
            log.warning("host lease %x expired; granting another and registering every entry again", lease_id)
        async with self._granting:
            if self._revoked or self.lease_id != lease_id:
                return  # revoked meanwhile, or granted again by a registration
            self.lease_id = None
            self._renewed()  # the keys on the old lease are gone: their terms end now
            await self._grant()
            self.failing_since = None

    async def revoke(self) -> None:
        """Revoke the lease (every key still on it goes): the host is done with etcd. Idempotent."""
        async with self._granting:
            self._revoked = True
            lease_id, self.lease_id = self.lease_id, None
            self._entries.clear()
            self._renewed()
        if lease_id is None:
            return
        try:
            await asyncio.wait_for(self.client.revoke_lease(lease_id), self.ttl_sec)
            log.info("revoked the host lease %x", lease_id)
        except (aetcd.ClientError, TimeoutError) as exc:  # it expires by itself
            log.debug("revoking the host lease %x: %r", lease_id, exc)


class HostedRegistration:
    """One hosted service's registry entry on its host's lease; used as its :class:`ReplicaRegistration` is.

    ``register()`` puts the entry, ``run(stop)`` waits for ``stop`` and then leaves (deletes the entry; the host
    renews the lease), ``deregister()`` leaves too: the lease is the host's to revoke.
    """

    def __init__(self, host: HostLease, record: ReplicaRecord) -> None:
        self.host = host
        self.record = record
        self._key = host.keys.replica(record.kind, record.id)
        self._left = False

    async def register(self) -> int:
        """Put the entry on the host's lease; the revision of the put."""
        if self._left:
            raise LeftRegistry(f"{self.record.kind} replica {self.record.id} has left the registry")
        self.record = replace(self.record, heartbeat=_now())
        return await self.host._put(self._key, self.record)

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop`` (the host renews the lease); then leave the registry."""
        try:
            await stop.wait()
        finally:
            await asyncio.shield(self.leave())

    async def leave(self) -> None:
        """Delete the entry now, so peers see this replica go; its leader key stays until its term resigns."""
        if self._left:
            return
        self._left = True
        await self.host._forget(self._key)
        log.info("%s replica %s left the registry", self.record.kind, self.record.id)

    async def deregister(self) -> None:
        """Leave (the host revokes the lease once every service it runs is done)."""
        await self.leave()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
