"""`sundial hydrator`: promote near-due occurrences from Postgres into the Redis hot window.

Run several replicas: one is active (elected in etcd, see ``sundial_common.coordination.singleton``), the others
stand by
and take over within a lease TTL.
"""

from __future__ import annotations

import asyncio
import logging

from redis.asyncio import Redis
from sundial_common.commands.host import HostedService
from sundial_common.coordination.singleton import run_singleton
from sundial_common.hotwindow.window import HotWindow
from sundial_common.runtime.instrumentation import observed
from sundial_common.runtime.logs import setup_logging
from sundial_common.runtime.service import every, run
from sundial_common.runtime.settings import SettingsHelpParser, load_settings
from sundial_common.stores import Stores
from sundial_common.stores.zone_rules import PostgresZoneRuleStore

from sundial_hydrator.hydrator import Hydrator, HydratorConfig
from sundial_hydrator.settings import HydratorSettings
from sundial_hydrator.zone_rules import ZoneRules

log = logging.getLogger("sundial.hydrator")


async def serve(settings: HydratorSettings, stop: asyncio.Event) -> None:
    """The hydrator's life until ``stop``: a registered replica, hydrating during each term it leads."""
    config = HydratorConfig(
        shards=settings.shards,
        hot_window_sec=settings.hot_window_sec,
        batch_size=settings.hydrator_batch_size,
        interval_sec=settings.hydrator_interval_sec,
        overdue_grace_sec=settings.hydrator_overdue_grace_sec,
        overdue_interval_sec=settings.hydrator_overdue_interval_sec,
    )
    stores = await Stores.connect(settings.database_url, max_size=4)
    redis = Redis.from_url(settings.redis_url)
    try:
        hydrator = Hydrator(stores, HotWindow(redis), config)
        zone_rules = ZoneRules(PostgresZoneRuleStore(stores.database), HotWindow(redis), config.hot_window_sec)
        log.info("hydrator started: %d shards, window %ds", config.shards, config.hot_window_sec)

        async def hydrate_while_leading(until: asyncio.Event) -> None:
            try:
                await zone_rules.reconcile()  # before the first pass promotes a next fire the new rules moved
            except Exception:
                log.exception("time-zone rules check failed; next fires stay as stored until the next term")
            try:
                await every(until, config.interval_sec, hydrator.run_once, name="hydrate")
            finally:
                hydrator.forget_gauges()

        await run_singleton(stop, "hydrator", settings, hydrate_while_leading)
    finally:
        await redis.aclose()
        await stores.close()
        log.info("hydrator stopped")


SERVICE = HostedService("hydrator", HydratorSettings, serve)
"""The hydrator as ``sundial services --run hydrator,…`` hosts it (:mod:`sundial_common.commands.host`)."""


def main(argv: list[str] | None = None) -> int:
    parser = SettingsHelpParser(
        settings=HydratorSettings,
        prog="sundial hydrator",
        description="Promote occurrences due within the hot window from Postgres into Redis, and rebuild "
        "the window after Redis loses it. Run several replicas: one is active (elected through etcd), the "
        "others stand by and take over within a lease TTL (env SUNDIAL_LEASE_TTL_SEC).",
    )
    parser.add_argument("--interval", type=float, help="Seconds between passes (env SUNDIAL_HYDRATOR_INTERVAL_SEC).")
    parser.add_log_and_metrics_arguments()
    args = parser.parse_args(argv)
    settings = load_settings(
        HydratorSettings, parser, metrics_port=args.metrics_port, hydrator_interval_sec=args.interval
    )
    setup_logging(args.log_level or settings.log_level, settings.log_format)

    with observed("sundial-hydrator", settings):
        return run(lambda stop: serve(settings, stop))
