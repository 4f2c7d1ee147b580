"""`sundial dispatcher`: lead shards through etcd and dispatch their due occurrences to Kafka."""

from __future__ import annotations

import argparse
import asyncio
import logging

import aetcd
from redis.asyncio import Redis
from sundial_common.broker import KafkaPublisher
from sundial_common.hotwindow import HotWindow
from sundial_common.logs import setup_logging
from sundial_common.service import run, supervise
from sundial_common.store import Store
from sundial_common.telemetry import setup_tracing

from sundial_dispatcher.dispatcher import DispatcherConfig
from sundial_dispatcher.leadership import LeadershipConfig
from sundial_dispatcher.settings import DispatcherSettings
from sundial_dispatcher.shards import Dependencies, lead_shard

log = logging.getLogger("sundial.dispatcher")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sundial dispatcher",
        description="Campaign for every shard's etcd lease; for each shard led, claim due occurrences from "
        "its hot window, commit their executions in one fenced transaction and publish them to the pools' "
        "Kafka topics. Run several replicas: standbys take over within a lease TTL.",
    )
    parser.add_argument("--log-level", help="Logging level (env SUNDIAL_LOG_LEVEL).")
    parser.add_argument("--lease-ttl", type=float, help="Lease TTL in seconds (env SUNDIAL_LEASE_TTL_SEC).")
    args = parser.parse_args(argv)
    settings = DispatcherSettings()
    setup_logging(args.log_level or settings.log_level, settings.log_format)
    setup_tracing("sundial-dispatcher", settings.otlp_endpoint)
    config = DispatcherConfig(
        shards=settings.shards,
        batch_size=settings.dispatcher_batch_size,
        poll_interval_sec=settings.dispatcher_poll_interval_sec,
        hot_window_sec=settings.hot_window_sec,
    )
    leadership_config = LeadershipConfig(
        ttl_sec=args.lease_ttl or settings.lease_ttl_sec, margin_sec=settings.lease_margin_sec
    )

    async def serve(stop: asyncio.Event) -> None:
        host, _, port = settings.etcd_endpoint.rpartition(":")
        store = await Store.connect(settings.database_url, max_size=max(2, config.shards))
        redis = Redis.from_url(settings.redis_url)
        publisher = KafkaPublisher(settings.kafka_bootstrap)
        etcd = aetcd.Client(host=host or "127.0.0.1", port=int(port))
        deps = Dependencies(store, HotWindow(redis), publisher, etcd)
        log.info("dispatcher %s started: campaigning for %d shards", settings.instance_id, config.shards)
        try:
            await supervise(
                stop,
                {
                    f"shard-{shard}": lead_shard(stop, shard, settings.instance_id, deps, config, leadership_config)
                    for shard in range(config.shards)
                },
            )
        finally:
            await publisher.close()
            await etcd.close()
            await redis.aclose()
            await store.close()
            log.info("dispatcher stopped")

    return run(serve)
