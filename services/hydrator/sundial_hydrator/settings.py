"""Hydrator settings: the shared ones plus the promotion knobs (env SUNDIAL_HYDRATOR_*)."""

from __future__ import annotations

from pydantic import Field
from sundial_common.runtime.settings import CommonSettings


class HydratorSettings(CommonSettings):
    hydrator_batch_size: int = Field(5000, ge=1, description="Rows per range-scan page.")
    hydrator_interval_sec: float = Field(1.0, gt=0, description="Seconds between passes.")
    hydrator_overdue_grace_sec: float = Field(15.0, gt=0, description="Re-add jobs this late and unfired.")
    hydrator_overdue_interval_sec: float = Field(10.0, gt=0, description="Seconds between overdue scans.")
