"""Dispatcher settings: the shared ones (incl. `SUNDIAL_LEASE_*`) plus claim and campaign knobs."""

from __future__ import annotations

from pydantic import Field
from sundial_common.runtime.settings import CommonSettings


class DispatcherSettings(CommonSettings):
    dispatcher_batch_size: int = Field(1000, ge=1, le=10000, description="Members claimed per pass.")
    dispatcher_poll_interval_sec: float = Field(0.05, gt=0, description="Seconds between passes when idle.")
    dispatcher_fairness: bool = Field(
        True,
        description="Weighted fair dispatch across tenants, with short pool queues and the tenants' "
        "maxConcurrentExecutions/maxDispatchPerSec quotas (off: earliest due first, whoever it belongs to, and "
        "those quotas do not act). See the tenants guide.",
    )
    dispatcher_pool_queue_cap: int = Field(
        1000,
        ge=1,
        description="Most executions of one pool waiting in its Kafka topic (published, not started) before the "
        "dispatcher holds the rest back, where fairness can still order them.",
    )
    dispatcher_pool_queue_first: int = Field(
        8,
        ge=1,
        description="The cap of a pool whose start rate this dispatcher has not measured yet (after a start, a "
        "failover or a quiet spell) and that has no live worker announced (with workers, the cap is their "
        "announced free slots): its first burst waits beyond this in priority order until a worker appears (or "
        "until the stalled-pool rule lets it through after 3 s).",
    )
    dispatcher_publish_lead_ms: int = Field(
        200,
        ge=0,
        le=1000,
        description="Executions are committed and published up to this long before they are due, and each worker "
        "holds the message until its due instant: the dispatch pass, the produce and the fetch are then done "
        "before it (0: published at the due instant). Upgrade workers before dispatchers.",
    )
    dispatcher_publish_gather_ms: int = Field(
        500,
        ge=0,
        le=1000,
        description="With a publish lead, a sparse stream's dispatch pass also takes what comes due within this "
        "long after the earliest member, so one pass, transaction and produce request carry several executions "
        "(their workers hold each until its due instant: no start moves). 0: one pass per due instant.",
    )
    dispatcher_orphan_grace_sec: float = Field(
        1.0,
        gt=0,
        description="A replica takes over a shard it does not own once the shard has had no leader this long "
        "(its owner gets the first chance), so no shard stays orphaned.",
    )
