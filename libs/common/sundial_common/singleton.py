"""One active replica per role (hydrator, sweeper): register, campaign in etcd, run the loop only while leading.

Both loops are safe to run on several replicas at once (every write is idempotent or compare-and-set,
DESIGN invariant 3), so they need no fencing; they are elected anyway so that N replicas do not do N times
the Postgres scans and Redis writes. A standby watches the role's leader key and takes over the moment it
is deleted (the leader stopped) or expires (it died): a gap of at most one lease TTL in work whose own
thresholds are seconds (the sweeper) or that only recovers what the API and the dispatcher already keep
current (the hydrator). See the README's high-availability section.

**Hosted together** (``sundial services``): inside :func:`sharing_one_lease`, every singleton of the process
registers on the host's one etcd client and lease (``sundial_common.host_lease``) instead of opening its own;
each still has its own registry entry, leader key and election.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar

from sundial_common.host_lease import HostedRegistration, HostLease
from sundial_common.leadership import LeadershipConfig, ShardLeadership, SharedLease, run_as_leader
from sundial_common.registry import ClusterKeys, ReplicaRecord, ReplicaRegistration, etcd_client
from sundial_common.service import supervise
from sundial_common.settings import CommonSettings

__all__ = ["run_singleton", "sharing_one_lease"]

log = logging.getLogger(__name__)

_HOST: ContextVar[tuple[str, HostLease] | None] = ContextVar("sundial_host_lease", default=None)
"""The host's etcd endpoint and lease while :func:`sharing_one_lease` runs (its services' tasks inherit it)."""


@contextlib.asynccontextmanager
async def sharing_one_lease(stop: asyncio.Event, settings: CommonSettings) -> AsyncIterator[None]:
    """Within: every :func:`run_singleton` of this task (and of tasks it creates) on one client and one lease.

    The lease is renewed until the block ends, after the services resigned and left, and then revoked. If its
    renewal loop dies (a bug: it retries every etcd error), ``stop`` is set so that the services stop with it.
    """
    etcd = etcd_client(settings.etcd_endpoint)
    host = HostLease(etcd, ttl_sec=settings.lease_ttl_sec)
    done = asyncio.Event()
    renewing = asyncio.create_task(host.run(done), name="sundial-host-lease")
    renewing.add_done_callback(lambda _task: None if done.is_set() else stop.set())
    token = _HOST.set((settings.etcd_endpoint, host))
    try:
        yield
    finally:
        _HOST.reset(token)
        done.set()
        try:
            await renewing
        finally:
            await host.revoke()
            await etcd.close()


async def run_singleton(
    stop: asyncio.Event,
    role: str,
    settings: CommonSettings,
    work: Callable[[asyncio.Event], Awaitable[None]],
) -> None:
    """Until ``stop``: be a registered replica of ``role``, and run ``work(until)`` during each term it leads.

    ``until`` is set when the term ends or the process stops; ``work`` should finish its pass and return.
    """
    keys = ClusterKeys()
    record = ReplicaRecord.for_this_process(role, settings.instance_id)
    registration: ReplicaRegistration | HostedRegistration
    lease: SharedLease
    shared = _HOST.get()
    if shared is not None and shared[0] == settings.etcd_endpoint and shared[1].ttl_sec == settings.lease_ttl_sec:
        host = shared[1]
        etcd, registration, lease, own_client = host.client, host.entry(record), host, False
    else:
        if shared is not None:
            log.info("%s: its etcd endpoint or lease TTL is not the host's; registering on a lease of its own", role)
        etcd = etcd_client(settings.etcd_endpoint)
        registration = lease = ReplicaRegistration(etcd, record, ttl_sec=settings.lease_ttl_sec, keys=keys)
        own_client = True
    config = LeadershipConfig(
        ttl_sec=settings.lease_ttl_sec, margin_sec=settings.lease_margin_sec, key_prefix=keys.role_prefix(role)
    )
    # The role's leader key rides on the registry entry's lease: one keep-alive for both (sundial_common.registry).
    leadership = ShardLeadership(etcd, 0, settings.instance_id, config, lease=lease)
    try:
        await registration.register()
        await supervise(
            stop,
            {
                "registry": registration.run(stop),
                f"{role}-leadership": run_as_leader(stop, leadership, work, role=role),
            },
        )
    finally:
        await registration.deregister()
        if own_client:
            await etcd.close()
