"""Sweeper settings: the shared ones plus thresholds (env SUNDIAL_SWEEPER_*)."""

from __future__ import annotations

from pydantic import Field
from sundial_common.settings import CommonSettings

from sundial_sweeper.sweeper import SweeperConfig


class SweeperSettings(CommonSettings):
    sweeper_interval_sec: float = Field(2.0, gt=0, description="Seconds between passes.")
    sweeper_unpublished_after_sec: float = Field(5.0, gt=0, description="Republish PENDING never published.")
    sweeper_unstarted_after_sec: float = Field(60.0, gt=0, description="Republish PENDING published, not started.")
    sweeper_heartbeat_ttl_sec: float = Field(
        6.0,
        gt=0,
        description="The workers' liveness TTL (SUNDIAL_WORKER_HEARTBEAT_TTL_SEC): younger attempts are not judged.",
    )
    sweeper_lost_confirm_sec: float = Field(
        4.0,
        ge=0,
        description="How long a liveness key must stay missing before its attempt is FAILED_WORKER_LOST; must exceed "
        "the workers' renewal interval (SUNDIAL_WORKER_HEARTBEAT_INTERVAL_SEC), so a flushed Redis loses no attempt.",
    )
    sweeper_timeout_grace_sec: float = Field(
        15.0, ge=0, description="A RUNNING attempt this long past its timeoutSec is TIMED_OUT by the sweeper."
    )

    sweeper_gauges_interval_sec: float = Field(
        15.0, gt=0, description="Seconds between samples of sundial_jobs and sundial_dead_letter_queue_size."
    )

    def sweeper_config(self, interval_sec: float | None = None) -> SweeperConfig:
        return SweeperConfig(
            unpublished_after_sec=self.sweeper_unpublished_after_sec,
            unstarted_after_sec=self.sweeper_unstarted_after_sec,
            interval_sec=interval_sec or self.sweeper_interval_sec,
            heartbeat_ttl_sec=self.sweeper_heartbeat_ttl_sec,
            lost_confirm_sec=self.sweeper_lost_confirm_sec,
            timeout_grace_sec=self.sweeper_timeout_grace_sec,
            actor=f"sweeper:{self.instance_id}",
            hot_window_sec=self.hot_window_sec,
            gauges_interval_sec=self.sweeper_gauges_interval_sec,
        )
