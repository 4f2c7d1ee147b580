"""`sundial sweeper`: republish executions whose messages were lost."""

from __future__ import annotations

import argparse
import asyncio
import logging

from sundial_common.broker import KafkaPublisher
from sundial_common.logs import setup_logging
from sundial_common.service import every, run
from sundial_common.store import Store

from sundial_sweeper.settings import SweeperSettings
from sundial_sweeper.sweeper import Sweeper, SweeperConfig

log = logging.getLogger("sundial.sweeper")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sundial sweeper",
        description="Find executions that fell between the cracks (never published, or published and never "
        "started) and publish them again. Safe to run on several replicas.",
    )
    parser.add_argument("--interval", type=float, help="Seconds between passes (env SUNDIAL_SWEEPER_INTERVAL_SEC).")
    parser.add_argument("--log-level", help="Logging level (env SUNDIAL_LOG_LEVEL).")
    args = parser.parse_args(argv)
    settings = SweeperSettings()
    setup_logging(args.log_level or settings.log_level, settings.log_format)
    config = SweeperConfig(
        unpublished_after_sec=settings.sweeper_unpublished_after_sec,
        unstarted_after_sec=settings.sweeper_unstarted_after_sec,
        interval_sec=args.interval or settings.sweeper_interval_sec,
    )

    async def serve(stop: asyncio.Event) -> None:
        store = await Store.connect(settings.database_url, max_size=2)
        publisher = KafkaPublisher(settings.kafka_bootstrap)
        try:
            sweeper = Sweeper(store, publisher, config)
            log.info("sweeper started")
            await every(
                stop,
                config.interval_sec,
                sweeper.run_once,
                name="sweep",
                again_now=lambda r: r.republished >= config.batch_size,
            )
        finally:
            await publisher.close()
            await store.close()
            log.info("sweeper stopped")

    return run(serve)
