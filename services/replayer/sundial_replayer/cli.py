"""`sundial replayer`: run the replays asked for with `POST /v1/replays` (`sundial replay`) and the bulk operations
of `POST /v1/bulk-operations` (`sundial bulk`).

Run several replicas: one is active (elected in etcd, see ``sundial_common.coordination.singleton``), the others
stand by
and take over within a lease TTL, resuming each RUNNING replay where its committed progress stands.
"""

from __future__ import annotations

import asyncio
import logging

from redis.asyncio import Redis
from sundial_common.broker.topic_windows import KafkaTopicInspector
from sundial_common.commands.host import HostedService
from sundial_common.coordination.singleton import run_singleton
from sundial_common.hotwindow.window import HotWindow
from sundial_common.runtime.instrumentation import observed
from sundial_common.runtime.logs import setup_logging
from sundial_common.runtime.service import every, run
from sundial_common.runtime.settings import SettingsHelpParser, load_settings
from sundial_common.stores import Stores

from sundial_replayer.bulk import BulkPassResult, BulkRunner
from sundial_replayer.kafka import KafkaReplayKafka
from sundial_replayer.replayer import Replayer, ReplayPassResult
from sundial_replayer.settings import ReplayerSettings

log = logging.getLogger("sundial.replayer")


async def serve(settings: ReplayerSettings, stop: asyncio.Event) -> None:
    """The replayer's life until ``stop``: a registered replica, replaying during each term it leads."""
    config = settings.replayer_config()
    bulk_config = settings.bulk_config()
    # Replays, and bulk operations of several tenants at once.
    stores = await Stores.connect(settings.database_url, max_size=6)
    kafka = KafkaReplayKafka(settings.kafka_bootstrap, client_id=f"sundial-replayer-{settings.instance_id}")
    topics = KafkaTopicInspector(settings.kafka_bootstrap)
    redis = Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
    try:
        log.info("replayer started")

        async def replay_while_leading(until: asyncio.Event) -> None:
            replayer = Replayer(stores, kafka, topics, config)  # a new term holds nothing yet: resumes count

            def busy(result: ReplayPassResult) -> bool:
                return result.active > 0

            runner = BulkRunner(stores.bulk, bulk_config, HotWindow(redis))  # likewise

            def acting(result: BulkPassResult) -> bool:
                return result.active > 0

            await asyncio.gather(
                every(
                    until,
                    config.interval_sec,
                    replayer.run_once,
                    name="replay",
                    again_now=busy,
                    idle_interval=config.idle_interval_sec,
                ),
                every(
                    until,
                    bulk_config.interval_sec,
                    runner.run_once,
                    name="bulk",
                    again_now=acting,
                    idle_interval=bulk_config.idle_interval_sec,
                ),
            )

        await run_singleton(stop, "replayer", settings, replay_while_leading)
    finally:
        await redis.aclose()
        await topics.close()
        await kafka.close()
        await stores.close()
        log.info("replayer stopped")


SERVICE = HostedService("replayer", ReplayerSettings, serve)
"""The replayer as ``sundial services --run …,replayer`` hosts it (:mod:`sundial_common.commands.host`)."""


def main(argv: list[str] | None = None) -> int:
    """Replay windows of pools' Kafka messages into staging pools and run bulk operations"""
    parser = SettingsHelpParser(
        settings=ReplayerSettings,
        prog="sundial replayer",
        description="Run replays: re-publish the messages of a pool's topic whose timestamps lie in a window into a "
        "staging pool's topic, committing progress to Postgres after every batch so a restarted replayer resumes "
        "where it stopped. Production state (executions, the pools' consumer groups) is never touched. Also runs bulk "
        "operations (POST /v1/bulk-operations), each resumed from its last committed batch. Run several "
        "replicas: one is active (elected through etcd), the others stand by (env SUNDIAL_LEASE_TTL_SEC).",
    )
    parser.add_argument(
        "--interval", type=float, help="Seconds between idle passes (env SUNDIAL_REPLAYER_INTERVAL_SEC)."
    )
    parser.add_log_and_metrics_arguments()
    args = parser.parse_args(argv)
    settings = load_settings(
        ReplayerSettings, parser, metrics_port=args.metrics_port, replayer_interval_sec=args.interval
    )
    setup_logging(args.log_level or settings.log_level, settings.log_format)

    with observed("sundial-replayer", settings):
        return run(lambda stop: serve(settings, stop))
