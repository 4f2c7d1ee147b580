"""Sweeper settings: the shared ones plus thresholds (env SUNDIAL_SWEEPER_*)."""

from __future__ import annotations

from pydantic import Field
from sundial_common.runtime.settings import CommonSettings
from sundial_common.stores.breakers import MAX_HOLD_SEC, BreakerSettings

from sundial_sweeper.breakers import BreakerLoopConfig
from sundial_sweeper.finished_operations import FinishedOperationsConfig
from sundial_sweeper.incidents import IncidentRetentionConfig, LateStartsConfig, OutcomeChangesConfig
from sundial_sweeper.job_retention import JobRetentionConfig
from sundial_sweeper.partitions import PartitionLoopConfig
from sundial_sweeper.pool_episodes import PoolEpisodesConfig
from sundial_sweeper.sweeper import SweeperConfig

_B = BreakerSettings()


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

    sweeper_clock_skew_sec: float = Field(
        1.0,
        ge=0,
        description="How far Postgres' clock may be from the sweeper's: a PENDING execution published this long before "
        "its pool's consumer group had acknowledged every message appended is sent again (the broker dropped it).",
    )
    sweeper_gauges_interval_sec: float = Field(
        15.0, gt=0, description="Seconds between samples of sundial_jobs and sundial_dead_letter_queue_size."
    )

    # The retry circuit breaker's defaults (a tenant overrides any of them: the admin tenants API's `breaker`).
    breaker_interval_sec: float = Field(1.0, gt=0, description="Seconds between passes of the breaker loop.")
    breaker_enabled: bool = Field(_B.enabled, description="Breakers open at all (a tenant may turn its own off).")
    breaker_failure_ratio: float = Field(
        _B.failure_ratio, gt=0, le=1, description="A breaker opens at this share of failed attempts in the window."
    )
    breaker_min_attempts: int = Field(
        _B.min_attempts, ge=1, description="... of at least this many finished attempts in the window."
    )
    breaker_window_sec: float = Field(_B.window_sec, ge=1, le=3600, description="The sliding window, seconds.")
    breaker_cooldown_sec: float = Field(
        _B.cooldown_sec, ge=1, description="Open this long before half-open probes; doubled at each re-open."
    )
    breaker_max_cooldown_sec: float = Field(_B.max_cooldown_sec, ge=1, description="The longest cool-down.")
    breaker_probes: int = Field(_B.probes, ge=1, le=100, description="Retries a half-open breaker lets through.")
    breaker_release_spread_sec: float = Field(
        _B.release_spread_sec, ge=0, description="A closing breaker releases its held retries over this many seconds."
    )
    breaker_max_hold_sec: float = Field(
        _B.max_hold_sec,
        ge=1,
        le=MAX_HOLD_SEC,
        description="The longest a breaker holds a retry; then the attempt ends without running (DEAD if the last).",
    )

    # The daily partitions of executions and attempts (retention: SUNDIAL_EXECUTION_RETENTION_DAYS) and audit_log.
    partitions_interval_sec: float = Field(
        600.0, gt=0, description="Seconds between passes of the partition loop (make days ahead, drop expired days)."
    )
    partitions_ahead_days: int = Field(
        7, ge=1, le=366, description="Days of execution partitions made ahead: how long dispatch survives no sweeper."
    )
    audit_retention_days: float = Field(
        90.0,
        ge=0,
        description="Days of audit_log kept: the partition loop drops each day of it once the day ended this long "
        "ago (GET .../audit then has no rows from it). 0 = kept forever.",
    )

    # Late starts, for the notification subscriptions to `execution.late`.
    late_start_grace_sec: float = Field(
        300.0,
        ge=0,
        le=86400,
        description="An occurrence not started this many seconds after its due time is late: an `execution.late` "
        "incident for the tenant's subscriptions (nothing is scanned while no tenant subscribed to it).",
    )
    late_start_interval_sec: float = Field(15.0, gt=0, description="Seconds between passes of the late-start scan.")

    outcome_change_interval_sec: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Seconds between passes of the scan for `execution.failing` / `execution.recovered` incidents "
        "(each pass reads the latest two finished occurrences of every job of the tenants subscribed to them; "
        "nothing is scanned while no tenant is).",
    )

    operation_finished_interval_sec: float = Field(
        15.0,
        gt=0,
        le=3600,
        description="Seconds between passes of the scan for `backfill.finished`, `replay.finished` and "
        "`bulk.finished` incidents (the operations of subscribed tenants that finished in the last day; nothing is "
        "scanned while no tenant is subscribed).",
    )
    pool_unserved_grace_sec: float = Field(
        60.0,
        ge=0,
        le=86400,
        description="How long a pool must have work (PENDING executions) and no live worker before a "
        "`pool.unserved` incident is recorded for its tenants' subscriptions.",
    )
    pool_unserved_interval_sec: float = Field(
        15.0, gt=0, le=3600, description="Seconds between passes of the pool episodes' judge (`pool.unserved`)."
    )

    notification_retention_days: int = Field(
        30, ge=1, le=3650, description="Days notification incidents and their delivery logs are kept."
    )

    def incident_retention_config(self) -> IncidentRetentionConfig:
        return IncidentRetentionConfig(keep_days=self.notification_retention_days)

    def finished_operations_config(self) -> FinishedOperationsConfig:
        return FinishedOperationsConfig(interval_sec=self.operation_finished_interval_sec)

    def pool_episodes_config(self) -> PoolEpisodesConfig:
        return PoolEpisodesConfig(grace_sec=self.pool_unserved_grace_sec, interval_sec=self.pool_unserved_interval_sec)

    def outcome_changes_config(self) -> OutcomeChangesConfig:
        return OutcomeChangesConfig(interval_sec=self.outcome_change_interval_sec)

    def late_starts_config(self) -> LateStartsConfig:
        return LateStartsConfig(grace_sec=self.late_start_grace_sec, interval_sec=self.late_start_interval_sec)

    def partition_config(self) -> PartitionLoopConfig:
        return PartitionLoopConfig(
            retention_days=self.execution_retention_days,
            audit_retention_days=self.audit_retention_days,
            ahead_days=self.partitions_ahead_days,
            interval_sec=self.partitions_interval_sec,
        )

    def job_retention_config(self) -> JobRetentionConfig:
        # Its horizon is the partition loop's oldest day left: it passes as often.
        return JobRetentionConfig(interval_sec=self.partitions_interval_sec)

    def breaker_config(self) -> BreakerLoopConfig:
        return BreakerLoopConfig(
            interval_sec=self.breaker_interval_sec,
            defaults=BreakerSettings(
                enabled=self.breaker_enabled,
                failure_ratio=self.breaker_failure_ratio,
                min_attempts=self.breaker_min_attempts,
                window_sec=self.breaker_window_sec,
                cooldown_sec=self.breaker_cooldown_sec,
                max_cooldown_sec=self.breaker_max_cooldown_sec,
                probes=self.breaker_probes,
                release_spread_sec=self.breaker_release_spread_sec,
                max_hold_sec=self.breaker_max_hold_sec,
            ),
            actor=f"sweeper:{self.instance_id}",
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
            clock_skew_sec=self.sweeper_clock_skew_sec,
        )
