"""Analytics settings: the shared ones plus where the ClickHouse replica lives and how the service feeds and
serves it (env SUNDIAL_CLICKHOUSE_*, SUNDIAL_ANALYTICS_*)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from sundial_common.runtime.settings import CommonSettings

from sundial_analytics.ingest import IngestConfig
from sundial_analytics.replica import ReplicaConfig


class AnalyticsSettings(CommonSettings):
    clickhouse_url: str | None = Field(
        None,
        description="A ClickHouse server for the replica (http://user:password@host:8123); unset = the embedded "
        "engine chDB in this process, at SUNDIAL_ANALYTICS_CHDB_PATH.",
    )
    clickhouse_database: str = Field("sundial", description="ClickHouse database of the replica's tables.")
    analytics_chdb_path: Path = Field(
        Path(".sundial/analytics/chdb"),
        description="chDB's data directory (embedded mode). Only one process may open it: the active replica.",
    )
    analytics_ttl_days: int = Field(
        400, ge=1, description="History kept in ClickHouse, by the executions' nominal time (a table TTL)."
    )
    analytics_host: str = Field("127.0.0.1", description="Interface the stats HTTP endpoint binds.")
    analytics_port: int = Field(
        8124,
        ge=0,
        le=65535,
        description="Port of the stats HTTP endpoint the API queries (SUNDIAL_ANALYTICS_URL); only the active "
        "replica binds it.",
    )
    analytics_batch_size: int = Field(10_000, ge=1, le=1_000_000, description="Events per ClickHouse insert.")
    analytics_interval_sec: float = Field(
        IngestConfig().interval_sec, gt=0, description="Pause after an ingest pass that found less than a full batch."
    )

    def replica_config(self) -> ReplicaConfig:
        return ReplicaConfig(
            url=self.clickhouse_url,
            chdb_path=self.analytics_chdb_path,
            database=self.clickhouse_database,
            ttl_days=self.analytics_ttl_days,
        )

    def ingest_config(self) -> IngestConfig:
        return IngestConfig(batch_size=self.analytics_batch_size, interval_sec=self.analytics_interval_sec)
