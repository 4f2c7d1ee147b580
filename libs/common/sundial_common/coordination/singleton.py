"""One active replica per role (hydrator, sweeper): register, campaign in etcd, run the loop only while leading.

Both loops are safe to run on several replicas at once (every write is idempotent or compare-and-set,
DESIGN invariant 3), so they need no fencing; they are elected anyway so that N replicas do not do N times
the Postgres scans and Redis writes. A standby watches the role's leader key and takes over the moment it
is deleted (the leader stopped) or expires (it died): a gap of at most one lease TTL in work whose own
thresholds are seconds (the sweeper) or that only recovers what the API and the dispatcher already keep
current (the hydrator). See docs/operations/high-availability.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from sundial_common.coordination.leadership import LeadershipConfig, ShardLeadership, run_as_leader
from sundial_common.coordination.registry import ClusterKeys, ReplicaRecord, ReplicaRegistration, etcd_client
from sundial_common.runtime.service import supervise
from sundial_common.runtime.settings import CommonSettings

__all__ = ["run_singleton"]


async def run_singleton(
    stop: asyncio.Event,
    role: str,
    settings: CommonSettings,
    work: Callable[[asyncio.Event], Awaitable[None]],
) -> None:
    """Until ``stop``: be a registered replica of ``role``, and run ``work(until)`` during each term it leads.

    ``until`` is set when the term ends or the process stops; ``work`` should finish its pass and return.
    """
    etcd = etcd_client(settings.etcd_endpoint)
    keys = ClusterKeys()
    registration = ReplicaRegistration(
        etcd, ReplicaRecord.for_this_process(role, settings.instance_id), ttl_sec=settings.lease_ttl_sec, keys=keys
    )
    config = LeadershipConfig(
        ttl_sec=settings.lease_ttl_sec, margin_sec=settings.lease_margin_sec, key_prefix=keys.role_prefix(role)
    )
    # The role's leader key rides on the registry entry's lease: one keep-alive for both
    # (sundial_common.coordination.registry).
    leadership = ShardLeadership(etcd, 0, settings.instance_id, config, lease=registration)
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
        await etcd.close()
