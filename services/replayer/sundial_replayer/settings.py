"""Replayer settings: the shared ones plus its loop's knobs (env SUNDIAL_REPLAYER_*)."""

from __future__ import annotations

from pydantic import Field
from sundial_common.runtime.settings import CommonSettings

from sundial_replayer.bulk import BulkConfig
from sundial_replayer.replayer import ReplayerConfig

_DEFAULTS = ReplayerConfig()
_BULK = BulkConfig()


class ReplayerSettings(CommonSettings):
    replayer_interval_sec: float = Field(
        _DEFAULTS.interval_sec, gt=0, description="Seconds between passes while nothing is to be replayed."
    )
    replayer_batch_size: int = Field(
        _DEFAULTS.batch_size,
        ge=1,
        description="Most messages read and re-published per batch; progress is committed to Postgres after each "
        "(so a killed replayer publishes at most one batch again).",
    )
    replayer_slice_sec: float = Field(
        _DEFAULTS.slice_sec, gt=0, description="Longest turn of one replay before the next replay's."
    )

    bulk_tenant_rate_per_sec: int = Field(
        _BULK.tenant_rate_per_sec,
        ge=1,
        description="Most rows a second one tenant's bulk operations act on together; an operation's `ratePerSec` "
        "is capped to it.",
    )
    bulk_per_tenant: int = Field(
        _BULK.per_tenant,
        ge=1,
        description="Bulk operations of one tenant that run at a time; later ones wait their turn in order.",
    )
    bulk_retention_days: float = Field(
        _BULK.retention_days,
        gt=0,
        description="Days a finished bulk operation (and each row's outcome) is kept before it is deleted.",
    )

    def bulk_config(self) -> BulkConfig:
        return BulkConfig(
            tenant_rate_per_sec=self.bulk_tenant_rate_per_sec,
            per_tenant=self.bulk_per_tenant,
            retention_days=self.bulk_retention_days,
        )

    def replayer_config(self, interval_sec: float | None = None) -> ReplayerConfig:
        return ReplayerConfig(
            interval_sec=interval_sec or self.replayer_interval_sec,
            batch_size=self.replayer_batch_size,
            slice_sec=self.replayer_slice_sec,
        )
