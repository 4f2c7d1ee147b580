"""The client's models against the server's OpenAPI document. The views are one definition the API imports
from ``sundial_client.models``; the request bodies are the client's own, so a field renamed, added, dropped,
made required or an enum value changed on either side fails here, and a new endpoint without a client call too.
"""

from __future__ import annotations

import enum
from typing import Any

import pytest
from pydantic import BaseModel
from sundial_api import ApiSettings, create_app
from sundial_client import models
from sundial_client.models import bulk

# client model → the OpenAPI schema it mirrors
PAIRS: dict[type[BaseModel], str] = {
    models.Job: "Job",
    models.JobDetail: "JobDetail",
    models.Execution: "Execution",
    models.ExecutionDetail: "ExecutionDetail",
    models.Attempt: "Attempt",
    models.ExecutionPage: "ExecutionPage",
    models.AuditEntry: "AuditEntry",
    models.AuditPage: "AuditPage",
    models.JobList: "JobList",
    models.Preview: "Preview",
    models.Fire: "Fire",
    models.Triggered: "Triggered",
    models.Problem: "Problem",
    models.FieldError: "FieldError",
    models.TargetView: "TargetView",
    models.NewJob: "JobCreate",
    models.Target: "Target",
    models.RetryPolicy: "RetryPolicy",
    models.SchedulePreviewRequest: "SchedulePreviewRequest",
    models.ClusterView: "ClusterView",
    models.ReplicaView: "ReplicaView",
    models.ShardView: "ShardView",
    models.RoleView: "RoleView",
    models.Replay: "Replay",
    models.ReplayPage: "ReplayList",
    models.ReplayPartition: "ReplayPartition",
    models.ReplayFilter: "ReplayFilterView",
    models.ReplayRun: "ReplayRun",
    models.ReplayRunPage: "ReplayRunList",
    models.ExecutionStats: "ExecutionStats",
    models.ExecutionStatsItem: "ExecutionStatsItem",
    models.Percentiles: "Percentiles",
    models.HandlerRanking: "HandlerRanking",
    models.HandlerStats: "HandlerStats",
    models.PoolDetail: "PoolDetail",
    models.PoolWorkers: "PoolWorkers",
    models.WorkerView: "WorkerView",
    models.PoolBacklog: "PoolBacklog",
    models.Breaker: "BreakerView",
    models.BreakerList: "BreakerList",
    bulk.BulkOperation: "BulkOperation",
    bulk.BulkOperationList: "BulkOperationList",
    bulk.BulkFilterView: "BulkFilterView",
    bulk.BulkDryRun: "BulkDryRun",
    bulk.BulkItem: "BulkItem",
    bulk.BulkItemList: "BulkItemList",
}
ENUMS: dict[type[enum.Enum], str] = {
    models.JobType: "JobType",
    models.JobState: "JobState",
    models.ExecutionState: "ExecutionState",
    models.OverlapPolicy: "OverlapPolicy",
    models.CatchupPolicy: "CatchupPolicy",
    models.Priority: "Priority",
    models.Backoff: "Backoff",
    models.ReplayState: "ReplayState",
    bulk.BulkState: "BulkState",
}
REQUESTS = {models.NewJob, models.Target, models.RetryPolicy, models.SchedulePreviewRequest}


@pytest.fixture(scope="module")
def schemas() -> dict[str, Any]:
    document = create_app(ApiSettings(jwt_secret="x" * 32)).openapi()
    found: dict[str, Any] = document["components"]["schemas"]
    return found


def _fields(model: type[BaseModel]) -> dict[str, bool]:
    return {(info.alias or name): info.is_required() for name, info in model.model_fields.items()}


@pytest.mark.parametrize("model", PAIRS, ids=lambda m: m.__name__)
def test_client_model_has_the_servers_fields(model: type[BaseModel], schemas: dict[str, Any]) -> None:
    schema = schemas[PAIRS[model]]
    assert set(_fields(model)) == set(schema["properties"])


@pytest.mark.parametrize("model", PAIRS, ids=lambda m: m.__name__)
def test_client_model_requires_what_the_server_requires(model: type[BaseModel], schemas: dict[str, Any]) -> None:
    required = set(schemas[PAIRS[model]].get("required", []))
    mine = {name for name, needed in _fields(model).items() if needed}
    if model in REQUESTS:
        # A request may leave out what the server defaults, never what it requires.
        assert mine == required
    else:
        # A response model may tolerate an absent field (older servers), never demand one the server may omit.
        assert mine <= required


@pytest.mark.parametrize("kind", ENUMS, ids=lambda e: e.__name__)
def test_client_enums_have_the_servers_values(kind: type[enum.Enum], schemas: dict[str, Any]) -> None:
    assert [member.value for member in kind] == schemas[ENUMS[kind]]["enum"]


def test_every_operation_of_the_api_has_a_client_call(schemas: dict[str, Any]) -> None:
    """A new endpoint without a client call fails here (health probes aside)."""
    document = create_app(ApiSettings(jwt_secret="x" * 32)).openapi()
    operations = {
        (method.upper(), path) for path, item in document["paths"].items() for method in item if path.startswith("/v1/")
    }
    covered = {
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs"),
        ("POST", "/v1/jobs:batch"),
        ("GET", "/v1/jobs/{job_id}"),
        ("GET", "/v1/jobs:by-key/{key}"),
        ("PATCH", "/v1/jobs/{job_id}"),
        ("DELETE", "/v1/jobs/{job_id}"),
        ("POST", "/v1/jobs/{job_id}/pause"),
        ("POST", "/v1/jobs/{job_id}/resume"),
        ("POST", "/v1/jobs/{job_id}/trigger"),
        ("GET", "/v1/jobs/{job_id}/preview"),
        ("GET", "/v1/jobs/{job_id}/executions"),
        ("POST", "/v1/schedules:preview"),
        ("GET", "/v1/executions"),
        ("GET", "/v1/executions/{execution_id}"),
        ("POST", "/v1/executions/{execution_id}/cancel"),
        ("POST", "/v1/executions/{execution_id}/retry"),
        ("GET", "/v1/jobs/{job_id}/audit"),
        ("GET", "/v1/executions/{execution_id}/audit"),
        ("GET", "/v1/admin/cluster"),
        ("POST", "/v1/replays"),
        ("GET", "/v1/replays"),
        ("GET", "/v1/replays/{replay_id}"),
        ("POST", "/v1/replays/{replay_id}/cancel"),
        ("GET", "/v1/replays/{replay_id}/runs"),
        ("POST", "/v1/bulk-operations"),
        ("GET", "/v1/bulk-operations"),
        ("GET", "/v1/bulk-operations/{operation_id}"),
        ("GET", "/v1/bulk-operations/{operation_id}/items"),
        ("POST", "/v1/bulk-operations/{operation_id}/cancel"),
        ("GET", "/v1/stats/executions"),
        ("GET", "/v1/stats/handlers"),
        ("POST", "/v1/admin/tenants"),
        ("GET", "/v1/admin/tenants"),
        ("GET", "/v1/admin/tenants/{tenant_id}"),
        ("PATCH", "/v1/admin/tenants/{tenant_id}"),
        ("POST", "/v1/admin/tenants/{tenant_id}/suspend"),
        ("POST", "/v1/admin/tenants/{tenant_id}/resume"),
        ("POST", "/v1/jobs/{job_id}:backfill"),
        ("GET", "/v1/backfills/{backfill_id}"),
        ("GET", "/v1/jobs/{job_id}/backfills"),
        ("POST", "/v1/backfills/{backfill_id}/cancel"),
        ("POST", "/v1/admin/pools"),
        ("GET", "/v1/admin/pools"),
        ("GET", "/v1/admin/pools/{name}"),
        ("PATCH", "/v1/admin/pools/{name}"),
        ("DELETE", "/v1/admin/pools/{name}"),
        ("GET", "/v1/pools"),
        ("GET", "/v1/pools/{name}"),
        ("POST", "/v1/pools/{name}/tokens"),
        ("GET", "/v1/pools/{name}/tokens"),
        ("DELETE", "/v1/pools/{name}/tokens/{token_id}"),
        ("PUT", "/v1/pools/{name}/target"),
        ("GET", "/v1/pools/{name}/target"),
        ("POST", "/v1/targets/{name}/completions/{execution_id}/{attempt}"),
        ("GET", "/v1/breakers"),
        ("GET", "/v1/breakers/{breaker_id}"),
        ("POST", "/v1/breakers/{breaker_id}:open"),
        ("POST", "/v1/breakers/{breaker_id}:close"),
        ("GET", "/v1/breakers/{breaker_id}/audit"),
        ("POST", "/v1/notifications/subscriptions"),
        ("GET", "/v1/notifications/subscriptions"),
        ("GET", "/v1/notifications/subscriptions/{subscription_id}"),
        ("DELETE", "/v1/notifications/subscriptions/{subscription_id}"),
        ("GET", "/v1/notifications/subscriptions/{subscription_id}/deliveries"),
        ("POST", "/v1/notifications/subscriptions/{subscription_id}/test"),
        ("POST", "/v1/notifications/subscriptions/{subscription_id}/rotate-secret"),
        ("POST", "/v1/admin/notification-destinations"),
        ("GET", "/v1/admin/notification-destinations"),
        ("DELETE", "/v1/admin/notification-destinations"),
    }
    assert operations == covered
