"""`sundial dispatcher`: lead this replica's share of the shards through etcd and dispatch their due occurrences.

One process = one replica: it registers in the etcd registry, follows the registry to know the live
replicas, and runs one campaign per shard (:mod:`sundial_dispatcher.shards`); its leader keys share the
registry entry's lease. On SIGTERM it first leaves the registry (deletes its entry) — so the other replicas
know at once who owns its shards now — then finishes each shard's pass in flight and deletes the leader keys,
and last revokes the lease; the new owners, already watching, lead within moments.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg
from redis.asyncio import Redis
from sundial_common.broker.kafka import KafkaPublisher
from sundial_common.broker.wakeups import WakingPublisher
from sundial_common.coordination.leadership import LeadershipConfig, ShardLeadership
from sundial_common.coordination.registry import (
    ClusterKeys,
    Membership,
    ReplicaRecord,
    ReplicaRegistration,
    etcd_client,
)
from sundial_common.hotwindow.window import HotWindow
from sundial_common.runtime.instrumentation import observed
from sundial_common.runtime.logs import setup_logging
from sundial_common.runtime.service import run, supervise
from sundial_common.runtime.settings import SettingsHelpParser, load_settings
from sundial_common.stores import Stores

from sundial_dispatcher.dispatcher import DispatcherConfig
from sundial_dispatcher.fairness import FairnessConfig
from sundial_dispatcher.settings import DispatcherSettings
from sundial_dispatcher.shards import CampaignConfig, Dependencies, Placement, ShardCampaign, dispatch_work
from sundial_dispatcher.side_work import SideWork
from sundial_dispatcher.topic_metadata import TopicMetadata, TopicMetadataConfig
from sundial_dispatcher.wakes import WakeListener

log = logging.getLogger("sundial.dispatcher")

#: Allocations between young-generation collections (CPython's default: 700), as for the worker and the API: a
#: planned execution allocates a few dozen short-lived objects (its id, span, rows, message), almost none in cycles.
GC_THRESHOLD = 7000


def main(argv: list[str] | None = None) -> int:
    parser = SettingsHelpParser(
        settings=DispatcherSettings,
        prog="sundial dispatcher",
        description="Lead this replica's share of the shards (etcd leases, balanced over the live replicas), "
        "claim due occurrences from their hot windows, commit their executions in one fenced transaction and "
        "publish them to the pools' Kafka topics. Run several replicas: the shards spread over them, and a "
        "standby takes over a dead replica's shards within a lease TTL.",
    )
    parser.add_argument("--log-level", help="Logging level (env SUNDIAL_LOG_LEVEL).")
    parser.add_argument("--lease-ttl", type=float, help="Lease TTL in seconds, at least 2 (env SUNDIAL_LEASE_TTL_SEC).")
    parser.add_argument("--instance-id", help="This replica's id in etcd (env SUNDIAL_INSTANCE_ID; default host-pid).")
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="Serve Prometheus metrics at /metrics on this port (env SUNDIAL_METRICS_PORT; default: not served).",
    )
    args = parser.parse_args(argv)
    overrides = {"lease_ttl_sec": args.lease_ttl, "instance_id": args.instance_id, "metrics_port": args.metrics_port}
    settings = load_settings(DispatcherSettings, parser, **overrides)
    setup_logging(args.log_level or settings.log_level, settings.log_format)
    config = DispatcherConfig(
        shards=settings.shards,
        batch_size=settings.dispatcher_batch_size,
        poll_interval_sec=settings.dispatcher_poll_interval_sec,
        hot_window_sec=settings.hot_window_sec,
        publish_lead_sec=settings.dispatcher_publish_lead_ms / 1000,
        gather_sec=settings.dispatcher_publish_gather_ms / 1000,
        fairness=FairnessConfig(
            enabled=settings.dispatcher_fairness,
            pool_queue_cap=settings.dispatcher_pool_queue_cap,
            pool_queue_first=settings.dispatcher_pool_queue_first,
        ),
    )
    keys = ClusterKeys()
    # Fenced: every write of a term goes through the shard's fence in Postgres, so a leader keeps its shards
    # through an etcd outage (sundial_common.coordination.leadership explains why that is safe).
    leadership_config = LeadershipConfig(
        ttl_sec=settings.lease_ttl_sec, margin_sec=settings.lease_margin_sec, key_prefix=keys.shard_prefix, fenced=True
    )
    campaign_config = CampaignConfig(shards=settings.shards, orphan_grace_sec=settings.dispatcher_orphan_grace_sec)
    me = settings.instance_id

    async def serve(stop: asyncio.Event) -> None:
        # Kept open and warmed (PostgresDispatchStore.warm): a burst's first passes would otherwise open them, and
        # its first starts wait for that.
        connections = max(2, config.shards)
        stores = await Stores.connect(settings.database_url, max_size=connections, max_inactive_connection_lifetime=0)
        try:
            await stores.dispatch.warm(connections)
        except (asyncpg.PostgresError, OSError) as exc:
            log.warning("dispatcher: connections not warmed: %r", exc)
        redis = Redis.from_url(settings.redis_url)
        # The pools' parked workers resume when told their topic has something (sundial_common.broker.wakeups).
        publisher = WakingPublisher(KafkaPublisher(settings.kafka_bootstrap), redis)
        etcd = etcd_client(settings.etcd_endpoint)
        wakes = WakeListener(redis)
        side_work = SideWork(stores.dependencies)
        deps = Dependencies(stores, HotWindow(redis), publisher, etcd, wakes, side_work)
        registration = ReplicaRegistration(
            etcd, ReplicaRecord.for_this_process("dispatcher", me), ttl_sec=settings.lease_ttl_sec, keys=keys
        )
        membership = Membership(etcd, "dispatcher", keys)
        placement = Placement(membership, config.shards)
        # Campaigns stop only after this replica has left the registry (see the module docstring).
        campaigns_stop = asyncio.Event()

        async def leave_then_stop_campaigns() -> None:
            await stop.wait()
            await registration.leave()
            campaigns_stop.set()

        try:
            # The view must include this replica before any campaign asks who owns what.
            await membership.catch_up(await registration.register())
            log.info(
                "dispatcher %s started: %d shards, %d live replicas (%s)",
                me,
                config.shards,
                len(membership.members),
                ", ".join(membership.members),
            )
            work = dispatch_work(deps, config, me)
            campaigns = {
                f"shard-{shard}": ShardCampaign(
                    shard,
                    # On the registry entry's lease: one keep-alive for the process
                    # (sundial_common.coordination.registry).
                    ShardLeadership(etcd, shard, me, leadership_config, lease=registration),
                    me=me,
                    etcd=etcd,
                    membership=membership,
                    placement=placement,
                    registration=registration,
                    work=work,
                    config=campaign_config,
                    keys=keys,
                ).run(campaigns_stop)
                for shard in range(config.shards)
            }
            await supervise(
                stop,
                {
                    "registry": registration.run(stop),
                    "membership": membership.run(campaigns_stop),
                    "wakes": wakes.run(campaigns_stop),
                    "side-work": side_work.run(campaigns_stop),
                    "topics": TopicMetadata(stores.pools, publisher, TopicMetadataConfig()).run(campaigns_stop),
                    "leave": leave_then_stop_campaigns(),
                    **campaigns,
                },
            )
        finally:
            await registration.deregister()
            await publisher.close()
            await etcd.close()
            await redis.aclose()
            await stores.close()
            log.info("dispatcher stopped")

    with observed("sundial-dispatcher", settings):
        return run(serve, young_collection_every=GC_THRESHOLD)
