"""Sweeper settings: the shared ones plus thresholds (env SUNDIAL_SWEEPER_*)."""

from __future__ import annotations

from pydantic import Field
from sundial_common.settings import CommonSettings


class SweeperSettings(CommonSettings):
    sweeper_interval_sec: float = Field(2.0, gt=0, description="Seconds between passes.")
    sweeper_unpublished_after_sec: float = Field(5.0, gt=0, description="Republish PENDING never published.")
    sweeper_unstarted_after_sec: float = Field(60.0, gt=0, description="Republish PENDING published, not started.")
