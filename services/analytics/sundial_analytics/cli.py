"""`sundial analytics`: replicate execution lifecycle events from Postgres into ClickHouse, serve the history
queries (Postgres' own retention is the sweeper's: it drops expired days of executions).

Run it as a singleton: one active replica (elected in etcd, see ``sundial_common.coordination.singleton``) drains the
outbox and binds the stats endpoint; a standby takes over within a lease TTL. With the
embedded chDB engine the data directory belongs to one process, so run one replica per directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Generator

import uvicorn
from clickhouse_connect.driver import options
from sundial_common.coordination.singleton import run_singleton
from sundial_common.runtime.instrumentation import observed
from sundial_common.runtime.logs import setup_logging
from sundial_common.runtime.service import every, run, supervise
from sundial_common.runtime.settings import SettingsHelpParser, load_settings
from sundial_common.stores import Stores

from sundial_analytics.http import create_app
from sundial_analytics.ingest import Ingester
from sundial_analytics.replica import ClickHouseReplica, Replica
from sundial_analytics.settings import AnalyticsSettings

log = logging.getLogger("sundial.analytics")


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside this process's event loop: the process's own stop signals stay in charge."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def serve_stats(until: asyncio.Event, replica: Replica, settings: AnalyticsSettings) -> None:
    """Serve the stats endpoint until ``until`` (the term ends or the process stops)."""
    config = uvicorn.Config(
        create_app(replica),
        host=settings.analytics_host,
        port=settings.analytics_port,
        lifespan="off",
        log_config=None,
        log_level="warning",
        access_log=False,
        server_header=False,
    )
    server = _EmbeddedServer(config)
    task = asyncio.create_task(server.serve(), name="stats-http-server")
    try:
        await until.wait()
    finally:
        server.should_exit = True
        await task


def main(argv: list[str] | None = None) -> int:
    parser = SettingsHelpParser(
        settings=AnalyticsSettings,
        prog="sundial analytics",
        description="Copy every execution lifecycle event (created, started, finished, retried, dead-lettered, "
        "cancelled, skipped) from Postgres' execution_events outbox into ClickHouse — a server at "
        "SUNDIAL_CLICKHOUSE_URL, else the embedded chDB engine under SUNDIAL_ANALYTICS_CHDB_PATH — in batches; "
        "answer the API's /v1/stats queries on a loopback port (SUNDIAL_ANALYTICS_PORT). One replica is active "
        "(elected through etcd). Postgres' own retention is the sweeper's.",
    )
    parser.add_argument("--log-level", help="Logging level (env SUNDIAL_LOG_LEVEL).")
    parser.add_argument("--port", type=int, help="Stats endpoint port (env SUNDIAL_ANALYTICS_PORT).")
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="Serve Prometheus metrics at /metrics on this port (env SUNDIAL_METRICS_PORT; default: not served).",
    )
    args = parser.parse_args(argv)
    overrides = {"metrics_port": args.metrics_port, "analytics_port": args.port}
    settings = load_settings(AnalyticsSettings, parser, **overrides)
    setup_logging(args.log_level or settings.log_level, settings.log_format)
    ingest = settings.ingest_config()

    async def serve(stop: asyncio.Event) -> None:
        stores = await Stores.connect(settings.database_url, max_size=3)
        replica = ClickHouseReplica(settings.replica_config())
        try:

            async def while_leading(until: asyncio.Event) -> None:
                await replica.ensure_schema()
                ingester = Ingester(stores.analytics, replica, ingest)
                log.info(
                    "analytics active: %s, stats on %s:%d",
                    "ClickHouse server" if settings.clickhouse_url else f"chDB at {settings.analytics_chdb_path}",
                    settings.analytics_host,
                    settings.analytics_port,
                )
                await supervise(
                    until,
                    {
                        "ingest": every(
                            until,
                            ingest.interval_sec,
                            ingester.run_once,
                            name="analytics_ingest",
                            again_now=lambda result: result.full(ingest),
                            idle_interval=ingest.idle_interval_sec,
                        ),
                        "stats-http": serve_stats(until, replica, settings),
                    },
                )

            await run_singleton(stop, "analytics", settings, while_leading)
        finally:
            await asyncio.to_thread(replica.close)
            await stores.close()
            log.info("analytics stopped")

    # clickhouse-connect imports pandas (a dependency of chDB) at the first insert: 1.3 s of CPU in the middle of the
    # first ingest pass; here it is part of the startup heap that run() freezes instead.
    options.check_pandas()  # type: ignore[no-untyped-call]
    with observed("sundial-analytics", settings):
        return run(serve)
