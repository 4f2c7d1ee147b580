"""`sundial sweeper`: end attempts whose worker was lost, republish executions whose messages were lost,
move the retry circuit breakers (:mod:`sundial_sweeper.breakers`), keep the daily partitions of executions
(made ahead, dropped past retention: :mod:`sundial_sweeper.partitions`), and delete jobs that ended (completed or
cancelled, of any type) once their executions are gone (:mod:`sundial_sweeper.job_retention`).

Run several replicas: one is active (elected in etcd, see ``sundial_common.coordination.singleton``), the others
stand by
and take over within a lease TTL.
"""

from __future__ import annotations

import asyncio
import logging

from redis.asyncio import Redis
from sundial_common.broker.kafka import KafkaIncarnation, KafkaPublisher
from sundial_common.commands.host import HostedService
from sundial_common.coordination.singleton import run_singleton
from sundial_common.hotwindow.worker_announcements import WorkerAnnouncements
from sundial_common.runtime.instrumentation import observed
from sundial_common.runtime.logs import setup_logging
from sundial_common.runtime.service import every, run
from sundial_common.runtime.settings import SettingsHelpParser, load_settings
from sundial_common.stores import Stores

from sundial_sweeper.breakers import BreakerLoop
from sundial_sweeper.broker_restart import BrokerRestartRepublisher
from sundial_sweeper.consumed import ConsumedHorizon
from sundial_sweeper.finished_operations import FinishedOperations
from sundial_sweeper.incidents import IncidentRetention, LateStarts, OutcomeChanges
from sundial_sweeper.job_retention import JobRetention
from sundial_sweeper.partitions import PartitionLoop
from sundial_sweeper.pool_episodes import PoolEpisodes
from sundial_sweeper.settings import SweeperSettings
from sundial_sweeper.sweeper import Sweeper

log = logging.getLogger("sundial.sweeper")


async def serve(settings: SweeperSettings, stop: asyncio.Event) -> None:
    """The sweeper's life until ``stop``: a registered replica, sweeping during each term it leads."""
    config = settings.sweeper_config()
    stores = await Stores.connect(settings.database_url, max_size=2)
    publisher = KafkaPublisher(settings.kafka_bootstrap)
    incarnation = KafkaIncarnation(settings.kafka_bootstrap)
    consumed = ConsumedHorizon(settings.kafka_bootstrap)
    # Liveness keys: a sick Redis must not stall the other scans for long.
    redis = Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
    try:
        restart = BrokerRestartRepublisher(stores.dispatch, publisher, incarnation, config.batch_size)
        sweeper = Sweeper(stores, publisher, config, redis=redis, broker_restart=restart, consumed=consumed)
        breaker_config = settings.breaker_config()
        breakers = BreakerLoop(stores.breakers, sweeper.hot_window, breaker_config)
        partition_config = settings.partition_config()
        partitions = PartitionLoop(stores.partitions, partition_config)
        retention = JobRetention(stores.jobs, stores.dependencies, stores.partitions, settings.job_retention_config())
        late_starts = LateStarts(stores.notifications, settings.late_starts_config())
        outcome_changes = OutcomeChanges(stores.notifications, settings.outcome_changes_config())
        finished_operations = FinishedOperations(stores.notifications, settings.finished_operations_config())
        pool_episodes = PoolEpisodes(stores.notifications, WorkerAnnouncements(redis), settings.pool_episodes_config())
        incident_retention = IncidentRetention(stores.notifications, settings.incident_retention_config())
        log.info("sweeper started")

        async def sweep_while_leading(until: asyncio.Event) -> None:
            # One batch per interval, never "again at once": in a backlog every waiting execution
            # looks unstarted, and republishing them back to back doubled the broker's and the
            # workers' load exactly when they were behind (a steady 5,000 a second).
            try:
                async with asyncio.TaskGroup() as loops:
                    loops.create_task(every(until, config.interval_sec, sweeper.run_once, name="sweep"))
                    loops.create_task(
                        every(until, breaker_config.interval_sec, breakers.run_once, name="breakers"),
                        name="breakers",
                    )
                    loops.create_task(
                        every(until, partition_config.interval_sec, partitions.run_once, name="partitions"),
                        name="partitions",
                    )
                    loops.create_task(
                        every(until, retention.config.interval_sec, retention.run_once, name="job-retention"),
                        name="job-retention",
                    )
                    loops.create_task(
                        every(until, late_starts.config.interval_sec, late_starts.run_once, name="late-starts"),
                        name="late-starts",
                    )
                    loops.create_task(
                        every(
                            until,
                            outcome_changes.config.interval_sec,
                            outcome_changes.run_once,
                            name="outcome-changes",
                        ),
                        name="outcome-changes",
                    )
                    loops.create_task(
                        every(
                            until,
                            finished_operations.config.interval_sec,
                            finished_operations.run_once,
                            name="finished-operations",
                        ),
                        name="finished-operations",
                    )
                    loops.create_task(
                        every(until, pool_episodes.config.interval_sec, pool_episodes.run_once, name="pool-episodes"),
                        name="pool-episodes",
                    )
                    loops.create_task(
                        every(
                            until,
                            incident_retention.config.interval_sec,
                            incident_retention.run_once,
                            name="incident-retention",
                        ),
                        name="incident-retention",
                    )
            finally:
                sweeper.forget_gauges()
                breakers.forget_gauges()

        await run_singleton(stop, "sweeper", settings, sweep_while_leading)
    finally:
        await publisher.close()
        await asyncio.to_thread(incarnation.close)
        await asyncio.to_thread(consumed.close)
        await redis.aclose()
        await stores.close()
        log.info("sweeper stopped")


SERVICE = HostedService("sweeper", SweeperSettings, serve)
"""The sweeper as ``sundial services --run …,sweeper,…`` hosts it (:mod:`sundial_common.commands.host`)."""


def main(argv: list[str] | None = None) -> int:
    parser = SettingsHelpParser(
        settings=SweeperSettings,
        prog="sundial sweeper",
        description="Find executions that fell between the cracks: attempts whose worker stopped heartbeating or "
        "that ran past their timeout (ended and retried by the job's policy), executions never published or "
        "published and never started (published again), dead letters (to sundial.dlq); and it moves the retry "
        "circuit breakers (SUNDIAL_BREAKER_*, sundial_sweeper.breakers); it makes the daily partitions of "
        "executions and of the audit log ahead and drops those past SUNDIAL_EXECUTION_RETENTION_DAYS and "
        "SUNDIAL_AUDIT_RETENTION_DAYS; it deletes jobs that ended (completed or cancelled) once their executions' "
        "days are gone. Run several replicas: one is active (elected through etcd), the others stand by and take "
        "over within a lease TTL (env SUNDIAL_LEASE_TTL_SEC).",
    )
    parser.add_argument("--interval", type=float, help="Seconds between passes (env SUNDIAL_SWEEPER_INTERVAL_SEC).")
    parser.add_log_and_metrics_arguments()
    args = parser.parse_args(argv)
    settings = load_settings(
        SweeperSettings, parser, metrics_port=args.metrics_port, sweeper_interval_sec=args.interval
    )
    setup_logging(args.log_level or settings.log_level, settings.log_format)

    with observed("sundial-sweeper", settings):
        return run(lambda stop: serve(settings, stop))
