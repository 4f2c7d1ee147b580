"""Replayer settings: the shared ones plus its loop's knobs (env SUNDIAL_REPLAYER_*)."""

from __future__ import annotations

from pydantic import Field
from sundial_common.runtime.settings import CommonSettings

from sundial_replayer.replayer import ReplayerConfig

_DEFAULTS = ReplayerConfig()


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

    def replayer_config(self, interval_sec: float | None = None) -> ReplayerConfig:
        return ReplayerConfig(
            interval_sec=interval_sec or self.replayer_interval_sec,
            batch_size=self.replayer_batch_size,
            slice_sec=self.replayer_slice_sec,
        )
