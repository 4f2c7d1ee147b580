"""Dispatcher settings: the shared ones plus claim and lease knobs (env SUNDIAL_DISPATCHER_*, SUNDIAL_LEASE_*)."""

from __future__ import annotations

from pydantic import Field
from sundial_common.settings import CommonSettings


class DispatcherSettings(CommonSettings):
    dispatcher_batch_size: int = Field(1000, ge=1, le=10000, description="Members claimed per pass.")
    dispatcher_poll_interval_sec: float = Field(0.05, gt=0, description="Seconds between passes when idle.")
    lease_ttl_sec: float = Field(5.0, ge=2.0, description="etcd lease TTL of a shard leadership.")
    lease_margin_sec: float = Field(1.0, gt=0, description="Stop trusting a term this long before it could expire.")
