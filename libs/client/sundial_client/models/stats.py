"""The tenant's history from the ClickHouse replica (`GET /v1/stats/executions`, `/v1/stats/handlers`)."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from sundial_client.models.common import ViewModel


class Percentiles(ViewModel):
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None


class ExecutionStatsItem(ViewModel):
    start: datetime = Field(description="Start of the bucket (UTC hour or day) of the executions' `scheduledFor`.")
    group: str | None = Field(description="The state, pool or handler (`groupBy`); null without `groupBy`.")
    executions: int
    succeeded: int
    failed: int = Field(description="Ended FAILED, TIMED_OUT, FAILED_WORKER_LOST or DEAD (after their retries).")
    open: int = Field(description="Still PENDING or RUNNING.")
    failure_rate: float | None = Field(description="failed / ended executions; null if none ended.")
    lateness_ms: Percentiles = Field(description="First attempt's start after its (jittered) fire time.")
    duration_ms: Percentiles = Field(description="Latest attempt's run time, for those that ran and ended.")


class ExecutionStats(ViewModel):
    from_: datetime = Field(alias="from")
    to: datetime
    interval: str
    group_by: str | None
    items: list[ExecutionStatsItem]


class HandlerStats(ViewModel):
    pool: str
    handler: str
    executions: int
    succeeded: int
    failed: int
    failure_rate: float | None
    duration_ms: Percentiles
    top_error_class: str | None = Field(description="The most frequent error class (`ValueError`), if any.")


class HandlerRanking(ViewModel):
    from_: datetime = Field(alias="from")
    to: datetime
    slowest: list[HandlerStats] = Field(description="By P95 duration, slowest first.")
    most_failing: list[HandlerStats] = Field(description="By failure rate, then failures; only handlers that failed.")
