"""The API's shapes, defined once: the API documents and serves these views, and the client reads them.

One module per resource (:mod:`~sundial_client.models.jobs`, :mod:`~sundial_client.models.executions`, …);
the server imports its views from here and keeps its request validation and its row-to-view rendering to
itself, so this package depends on pydantic alone. Fields are snake_case in Python and camelCase on the
wire (``next_fire_at`` ↔ ``nextFireAt``). :mod:`~sundial_client.models.requests` holds the bodies the client
sends. Every name is importable from here (``from sundial_client.models import Job``).
"""

from __future__ import annotations

from sundial_client.models.admin import ClusterView, ReplicaView, RoleView, ShardView
from sundial_client.models.audit import AuditEntry, AuditPage
from sundial_client.models.backfills import (
    DRY_RUN_LISTED,
    Backfill,
    BackfillList,
    BackfillOverlap,
    BackfillState,
    DryRun,
)
from sundial_client.models.batch import BatchItem, BatchResult
from sundial_client.models.breakers import (
    BreakerList,
    BreakerSettingsView,
    BreakerState,
    BreakerView,
    FirstFires,
    JobBreakerView,
)
from sundial_client.models.common import FieldError, Health, Problem, Readiness, ViewModel
from sundial_client.models.executions import (
    Attempt,
    Execution,
    ExecutionDetail,
    ExecutionList,
    ExecutionPage,
    ExecutionState,
    Priority,
)
from sundial_client.models.jobs import (
    Backoff,
    CatchupPolicy,
    DependencyCondition,
    Job,
    JobDetail,
    JobList,
    JobState,
    OverlapPolicy,
    Relative,
    TargetView,
    Triggered,
)
from sundial_client.models.pools import (
    PoolBacklog,
    PoolDelivery,
    PoolDetail,
    PoolKind,
    PoolList,
    PoolTargetView,
    PoolTokenIssued,
    PoolTokenList,
    PoolTokenView,
    PoolView,
    PoolWorkers,
    WorkerView,
)
from sundial_client.models.replays import (
    Replay,
    ReplayFilterView,
    ReplayList,
    ReplayPartition,
    ReplayRun,
    ReplayRunList,
    ReplayState,
)
from sundial_client.models.requests import (
    BackfillRequest,
    Dependency,
    NewJob,
    RequestBody,
    RetryPolicy,
    ScheduleFields,
    SchedulePreviewRequest,
    Target,
)
from sundial_client.models.schedules import Fire, JobType, Preview
from sundial_client.models.stats import ExecutionStats, ExecutionStatsItem, HandlerRanking, HandlerStats, Percentiles
from sundial_client.models.tenants import QuotasView, TenantList, TenantState, TenantView

# The client's names for views whose server names say what they are in the OpenAPI document.
Breaker = BreakerView
Pool = PoolView
Tenant = TenantView
Quotas = QuotasView
BackfillDryRun = DryRun
ReplayPage = ReplayList
ReplayRunPage = ReplayRunList
ReplayFilter = ReplayFilterView

__all__ = [
    "DRY_RUN_LISTED",
    "Attempt",
    "AuditEntry",
    "AuditPage",
    "Backfill",
    "BackfillDryRun",
    "BackfillList",
    "BackfillOverlap",
    "BackfillRequest",
    "BackfillState",
    "Backoff",
    "BatchItem",
    "BatchResult",
    "Breaker",
    "BreakerList",
    "BreakerSettingsView",
    "BreakerState",
    "BreakerView",
    "CatchupPolicy",
    "ClusterView",
    "Dependency",
    "DependencyCondition",
    "DryRun",
    "Execution",
    "ExecutionDetail",
    "ExecutionList",
    "ExecutionPage",
    "ExecutionState",
    "ExecutionStats",
    "ExecutionStatsItem",
    "FieldError",
    "Fire",
    "FirstFires",
    "HandlerRanking",
    "HandlerStats",
    "Health",
    "Job",
    "JobBreakerView",
    "JobDetail",
    "JobList",
    "JobState",
    "JobType",
    "NewJob",
    "OverlapPolicy",
    "Percentiles",
    "Pool",
    "PoolBacklog",
    "PoolDelivery",
    "PoolDetail",
    "PoolKind",
    "PoolList",
    "PoolTargetView",
    "PoolTokenIssued",
    "PoolTokenList",
    "PoolTokenView",
    "PoolView",
    "PoolWorkers",
    "Preview",
    "Priority",
    "Problem",
    "Quotas",
    "QuotasView",
    "Readiness",
    "Relative",
    "Replay",
    "ReplayFilter",
    "ReplayFilterView",
    "ReplayList",
    "ReplayPage",
    "ReplayPartition",
    "ReplayRun",
    "ReplayRunList",
    "ReplayRunPage",
    "ReplayState",
    "ReplicaView",
    "RequestBody",
    "RetryPolicy",
    "RoleView",
    "ScheduleFields",
    "SchedulePreviewRequest",
    "ShardView",
    "Target",
    "TargetView",
    "Tenant",
    "TenantList",
    "TenantState",
    "TenantView",
    "Triggered",
    "ViewModel",
    "WorkerView",
]
