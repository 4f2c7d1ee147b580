"""Every API operation as a :class:`Call`: method, path, query, body and how to read the answer.

Every namespace of the client (``client.jobs``, …) sends these, so an operation is described once here.
A create is marked ``idempotent_create``: the client generates one ``Idempotency-Key`` per call and sends it
with every retry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel
from pydantic.alias_generators import to_camel
from pydantic_core import to_jsonable_python

from sundial_client.models import (
    AuditPage,
    Backfill,
    BackfillDryRun,
    BackfillList,
    BackfillRequest,
    BatchResult,
    Breaker,
    BreakerList,
    ClusterView,
    Execution,
    ExecutionDetail,
    ExecutionPage,
    ExecutionState,
    ExecutionStats,
    HandlerRanking,
    Job,
    JobDetail,
    JobList,
    JobState,
    JobType,
    NewJob,
    Pool,
    PoolDetail,
    PoolList,
    PoolTargetView,
    PoolTokenIssued,
    PoolTokenList,
    Preview,
    Replay,
    ReplayList,
    ReplayRunList,
    SchedulePreviewRequest,
    Tenant,
    TenantList,
    Triggered,
)
from sundial_client.models.bulk import BulkDryRun, BulkItemList, BulkOperation, BulkOperationList
from sundial_client.models.notifications import (
    AllowedDestination,
    AllowedDestinationList,
    DeliveryList,
    SubscriptionList,
    SubscriptionView,
    TestSendView,
)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
M = TypeVar("M", bound=BaseModel)

#: Largest page the listing endpoints serve.
MAX_PAGE = 200
#: Largest batch ``POST /v1/jobs:batch`` takes.
MAX_BATCH = 1000


@dataclass(frozen=True)
class Call(Generic[T_co]):
    """One operation: what to send, and how to read its answer."""

    method: str
    path: str
    read: Callable[[httpx.Response], T_co]
    params: Mapping[str, Any] | None = None
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    idempotent_create: bool = False


def _model(model: type[M]) -> Callable[[httpx.Response], M]:
    def read(response: httpx.Response) -> M:
        return model.model_validate_json(response.content)

    return read


def _id(value: str) -> str:
    # Ids are UUIDs; quoting keeps a mistyped one from escaping its path segment.
    return quote(str(value), safe="")


def wire(body: BaseModel | Mapping[str, Any]) -> Any:
    """A request body as JSON-able data: a model through its aliases, a mapping as given."""
    if isinstance(body, NewJob | SchedulePreviewRequest):
        return body.to_wire()
    return to_jsonable_python(body)


def changes(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``update(...)`` keyword arguments as a PATCH body: camelCase names, JSON values (None clears)."""
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if isinstance(value, BaseModel):
            value = value.model_dump(mode="json", by_alias=True, exclude_none=True)
        out[to_camel(name)] = to_jsonable_python(value)
    return out


def _query(**params: Any) -> dict[str, Any]:
    return {k: (v.value if hasattr(v, "value") else v) for k, v in params.items() if v is not None}


# --- jobs -----------------------------------------------------------------------------------------


def create_job(job: NewJob | Mapping[str, Any]) -> Call[Job]:
    return Call("POST", "/v1/jobs", _model(Job), body=wire(job), idempotent_create=True)


def create_jobs(jobs: list[Any]) -> Call[BatchResult]:
    return Call("POST", "/v1/jobs:batch", _model(BatchResult), body={"jobs": jobs}, idempotent_create=True)


def get_job(job_id: str) -> Call[JobDetail]:
    return Call("GET", f"/v1/jobs/{_id(job_id)}", _model(JobDetail))


def get_job_by_key(key: str) -> Call[JobDetail]:
    return Call("GET", f"/v1/jobs:by-key/{quote(key, safe='/')}", _model(JobDetail))


def update_job(job_id: str, fields: Mapping[str, Any], if_match: int | None) -> Call[Job]:
    headers = {"If-Match": f'"{if_match}"'} if if_match is not None else {}
    return Call("PATCH", f"/v1/jobs/{_id(job_id)}", _model(Job), body=changes(fields), headers=headers)


def delete_job(job_id: str, cascade: bool = False) -> Call[Job]:
    params = {"cascade": "true"} if cascade else None
    return Call("DELETE", f"/v1/jobs/{_id(job_id)}", _model(Job), params=params)


def backfill_job(job_id: str, request: BackfillRequest) -> Call[Backfill]:
    return Call("POST", f"/v1/jobs/{_id(job_id)}:backfill", _model(Backfill), body=request.to_wire())


def backfill_dry_run(job_id: str, request: BackfillRequest) -> Call[BackfillDryRun]:
    body = {**request.to_wire(), "dryRun": True}
    return Call("POST", f"/v1/jobs/{_id(job_id)}:backfill", _model(BackfillDryRun), body=body)


def job_backfills(job_id: str, *, cursor: str | None, limit: int) -> Call[BackfillList]:
    params = {**_query(cursor=cursor), "limit": limit}
    return Call("GET", f"/v1/jobs/{_id(job_id)}/backfills", _model(BackfillList), params=params)


def get_backfill(backfill_id: str) -> Call[Backfill]:
    return Call("GET", f"/v1/backfills/{_id(backfill_id)}", _model(Backfill))


def cancel_backfill(backfill_id: str) -> Call[Backfill]:
    return Call("POST", f"/v1/backfills/{_id(backfill_id)}/cancel", _model(Backfill))


def pause_job(job_id: str) -> Call[Job]:
    return Call("POST", f"/v1/jobs/{_id(job_id)}/pause", _model(Job))


def resume_job(job_id: str) -> Call[Job]:
    return Call("POST", f"/v1/jobs/{_id(job_id)}/resume", _model(Job))


def trigger_job(job_id: str) -> Call[Triggered]:
    return Call("POST", f"/v1/jobs/{_id(job_id)}/trigger", _model(Triggered))


def preview_job(job_id: str, count: int) -> Call[Preview]:
    return Call("GET", f"/v1/jobs/{_id(job_id)}/preview", _model(Preview), params={"count": count})


def list_jobs(
    *,
    state: JobState | str | None,
    type: JobType | str | None,
    pool: str | None,
    handler: str | None,
    name_prefix: str | None,
    cursor: str | None,
    limit: int,
    key: str | None = None,
) -> Call[JobList]:
    params = _query(state=state, type=type, pool=pool, handler=handler, namePrefix=name_prefix, key=key, cursor=cursor)
    return Call("GET", "/v1/jobs", _model(JobList), params={**params, "limit": limit})


def job_executions(job_id: str, *, cursor: str | None, limit: int) -> Call[ExecutionPage]:
    params = {**_query(cursor=cursor), "limit": limit}
    return Call("GET", f"/v1/jobs/{_id(job_id)}/executions", _model(ExecutionPage), params=params)


def audit(kind: str, ident: str, *, actions: Sequence[str], cursor: str | None, limit: int) -> Call[AuditPage]:
    """A page of a job's (``kind`` "jobs") or an execution's ("executions") audit trail, oldest first."""
    params: dict[str, Any] = {**_query(cursor=cursor), "limit": limit}
    if actions:
        params["action"] = list(actions)
    return Call("GET", f"/v1/{kind}/{_id(ident)}/audit", _model(AuditPage), params=params)


def preview_schedule(request: SchedulePreviewRequest | Mapping[str, Any]) -> Call[Preview]:
    return Call("POST", "/v1/schedules:preview", _model(Preview), body=wire(request))


# --- executions -----------------------------------------------------------------------------------


def get_execution(execution_id: str) -> Call[ExecutionDetail]:
    return Call("GET", f"/v1/executions/{_id(execution_id)}", _model(ExecutionDetail))


def list_executions(
    state: ExecutionState | str | None,
    *,
    cursor: str | None,
    limit: int,
    job_id: str | None = None,
    pool: str | None = None,
    handler: str | None = None,
    scheduled_from: datetime | None = None,
    scheduled_to: datetime | None = None,
) -> Call[ExecutionPage]:
    window = {
        "scheduledFrom": scheduled_from and instant(scheduled_from),
        "scheduledTo": scheduled_to and instant(scheduled_to),
    }
    params = {**_query(state=state, jobId=job_id, pool=pool, handler=handler, cursor=cursor, **window), "limit": limit}
    return Call("GET", "/v1/executions", _model(ExecutionPage), params=params)


def cancel_execution(execution_id: str) -> Call[Execution]:
    return Call("POST", f"/v1/executions/{_id(execution_id)}/cancel", _model(Execution))


def retry_execution(execution_id: str) -> Call[Execution]:
    return Call("POST", f"/v1/executions/{_id(execution_id)}/retry", _model(Execution))


# --- admin ----------------------------------------------------------------------------------------


def cluster() -> Call[ClusterView]:
    return Call("GET", "/v1/admin/cluster", _model(ClusterView))


# --- stats ----------------------------------------------------------------------------------------


def execution_stats(
    start: datetime | None, end: datetime | None, interval: str, group_by: str | None
) -> Call[ExecutionStats]:
    params = _query(**{"from": start and instant(start), "to": end and instant(end), "groupBy": group_by})
    return Call("GET", "/v1/stats/executions", _model(ExecutionStats), params={**params, "interval": interval})


def handler_stats(start: datetime | None, end: datetime | None, limit: int) -> Call[HandlerRanking]:
    params = _query(**{"from": start and instant(start), "to": end and instant(end)})
    return Call("GET", "/v1/stats/handlers", _model(HandlerRanking), params={**params, "limit": limit})


def create_tenant(body: Mapping[str, Any]) -> Call[Tenant]:
    return Call("POST", "/v1/admin/tenants", _model(Tenant), body=changes(body))


def list_tenants(*, cursor: str | None, limit: int) -> Call[TenantList]:
    return Call("GET", "/v1/admin/tenants", _model(TenantList), params={**_query(cursor=cursor), "limit": limit})


def get_tenant(tenant_id: str) -> Call[Tenant]:
    return Call("GET", f"/v1/admin/tenants/{_id(tenant_id)}", _model(Tenant))


def update_tenant(tenant_id: str, fields: Mapping[str, Any]) -> Call[Tenant]:
    return Call("PATCH", f"/v1/admin/tenants/{_id(tenant_id)}", _model(Tenant), body=changes(fields))


def suspend_tenant(tenant_id: str) -> Call[Tenant]:
    return Call("POST", f"/v1/admin/tenants/{_id(tenant_id)}/suspend", _model(Tenant))


def resume_tenant(tenant_id: str) -> Call[Tenant]:
    return Call("POST", f"/v1/admin/tenants/{_id(tenant_id)}/resume", _model(Tenant))


def create_pool(body: Mapping[str, Any]) -> Call[Pool]:
    return Call("POST", "/v1/admin/pools", _model(Pool), body=changes(body))


def list_pools(*, cursor: str | None, limit: int, mine: bool = False) -> Call[PoolList]:
    """Every pool (admin), or with ``mine`` the pools the caller's tenant may use (``GET /v1/pools``)."""
    path = "/v1/pools" if mine else "/v1/admin/pools"
    return Call("GET", path, _model(PoolList), params={**_query(cursor=cursor), "limit": limit})


def get_pool(name: str) -> Call[Pool]:
    return Call("GET", f"/v1/admin/pools/{_id(name)}", _model(Pool))


def pool_detail(name: str) -> Call[PoolDetail]:
    """A pool the caller's tenant may use, with its live workers and the caller's backlog (``GET /v1/pools/{name}``)."""
    return Call("GET", f"/v1/pools/{_id(name)}", _model(PoolDetail))


def update_pool(name: str, fields: Mapping[str, Any]) -> Call[Pool]:
    return Call("PATCH", f"/v1/admin/pools/{_id(name)}", _model(Pool), body=changes(fields))


def delete_pool(name: str) -> Call[None]:
    return Call("DELETE", f"/v1/admin/pools/{_id(name)}", lambda _response: None)


def create_pool_token(name: str, fields: Mapping[str, Any]) -> Call[PoolTokenIssued]:
    """Mint a token for workers behind the worker gateway (``POST /v1/pools/{name}/tokens``)."""
    return Call("POST", f"/v1/pools/{_id(name)}/tokens", _model(PoolTokenIssued), body=changes(fields))


def list_pool_tokens(name: str, *, limit: int) -> Call[PoolTokenList]:
    return Call("GET", f"/v1/pools/{_id(name)}/tokens", _model(PoolTokenList), params={"limit": limit})


def revoke_pool_token(name: str, token_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/pools/{_id(name)}/tokens/{_id(token_id)}", lambda _response: None)


def put_pool_target(name: str, fields: Mapping[str, Any]) -> Call[PoolTargetView]:
    """Set where an HTTP pool's executions are POSTed (``PUT /v1/pools/{name}/target``)."""
    return Call("PUT", f"/v1/pools/{_id(name)}/target", _model(PoolTargetView), body=changes(fields))


def get_pool_target(name: str) -> Call[PoolTargetView]:
    return Call("GET", f"/v1/pools/{_id(name)}/target", _model(PoolTargetView))


def complete_target_attempt(
    pool: str, execution_id: str, attempt: int, token: str, fields: Mapping[str, Any]
) -> Call[None]:
    """Finish an attempt a target accepted (202), with its completion token instead of the client's."""
    return Call(
        "POST",
        f"/v1/targets/{_id(pool)}/completions/{_id(execution_id)}/{int(attempt)}",
        lambda _response: None,
        body=changes(fields),
        headers={"Authorization": f"Bearer {token}"},
    )


def instant(value: datetime) -> str:
    """An aware datetime as RFC 3339 (a naive one is sent as is: wall-clock time in the job's zone)."""
    return value.isoformat()


def list_breakers(*, pool: str | None = None, state: str | None = None) -> Call[BreakerList]:
    return Call("GET", "/v1/breakers", _model(BreakerList), params=_query(pool=pool, state=state))


def get_breaker(breaker_id: str) -> Call[Breaker]:
    return Call("GET", f"/v1/breakers/{_id(breaker_id)}", _model(Breaker))


def open_breaker(breaker_id: str) -> Call[Breaker]:
    return Call("POST", f"/v1/breakers/{_id(breaker_id)}:open", _model(Breaker))


def close_breaker(breaker_id: str) -> Call[Breaker]:
    return Call("POST", f"/v1/breakers/{_id(breaker_id)}:close", _model(Breaker))


def breaker_audit(breaker_id: str) -> Call[AuditPage]:
    return Call("GET", f"/v1/breakers/{_id(breaker_id)}/audit", _model(AuditPage))


# --- notifications ---------------------------------------------------------------------------------

SUBSCRIPTIONS = "/v1/notifications/subscriptions"


def create_subscription(
    url: str | None,
    events: Sequence[str],
    *,
    email: str | None = None,
    pool: str | None = None,
    job_id: str | None = None,
    description: str | None = None,
) -> Call[SubscriptionView]:
    body = {
        "url": url,
        "email": email,
        "events": list(events),
        "pool": pool,
        "jobId": job_id,
        "description": description,
    }
    return Call("POST", SUBSCRIPTIONS, _model(SubscriptionView), body={k: v for k, v in body.items() if v is not None})


def allow_destination(tenant: str, url: str) -> Call[AllowedDestination]:
    body = {"tenant": tenant, "url": url}
    return Call("POST", "/v1/admin/notification-destinations", _model(AllowedDestination), body=body)


def allowed_destinations(tenant: str | None = None) -> Call[AllowedDestinationList]:
    params = _query(tenant=tenant)
    return Call("GET", "/v1/admin/notification-destinations", _model(AllowedDestinationList), params=params)


def revoke_destination(tenant: str, url: str) -> Call[None]:
    params = {"tenant": tenant, "url": url}
    return Call("DELETE", "/v1/admin/notification-destinations", lambda _response: None, params=params)


def list_subscriptions() -> Call[SubscriptionList]:
    return Call("GET", SUBSCRIPTIONS, _model(SubscriptionList))


def get_subscription(subscription_id: str) -> Call[SubscriptionView]:
    return Call("GET", f"{SUBSCRIPTIONS}/{_id(subscription_id)}", _model(SubscriptionView))


def delete_subscription(subscription_id: str) -> Call[None]:
    return Call("DELETE", f"{SUBSCRIPTIONS}/{_id(subscription_id)}", lambda _response: None)


def subscription_deliveries(subscription_id: str, *, limit: int = 50) -> Call[DeliveryList]:
    return Call(
        "GET", f"{SUBSCRIPTIONS}/{_id(subscription_id)}/deliveries", _model(DeliveryList), params={"limit": limit}
    )


def rotate_subscription_secret(subscription_id: str, *, previous_valid_sec: int = 86_400) -> Call[SubscriptionView]:
    return Call(
        "POST",
        f"{SUBSCRIPTIONS}/{_id(subscription_id)}/rotate-secret",
        _model(SubscriptionView),
        params={"previousValidSec": previous_valid_sec},
    )


def test_subscription(subscription_id: str) -> Call[TestSendView]:
    return Call("POST", f"{SUBSCRIPTIONS}/{_id(subscription_id)}/test", _model(TestSendView))


# --- replays --------------------------------------------------------------------------------------


def create_replay(
    *,
    source_pool: str,
    window_from: datetime,
    window_to: datetime,
    target_pool: str,
    handler: str | None = None,
    job_id: str | None = None,
    tenant_id: str | None = None,
    rate_per_sec: int | None = None,
    dry_run: bool = False,
) -> Call[Replay]:
    found = {"handler": handler, "jobId": job_id, "tenantId": tenant_id}
    body: dict[str, Any] = {
        "sourcePool": source_pool,
        "from": instant(window_from),
        "to": instant(window_to),
        "targetPool": target_pool,
        "filter": {k: v for k, v in found.items() if v is not None},
        "dryRun": dry_run,
    }
    if rate_per_sec is not None:
        body["ratePerSec"] = rate_per_sec
    return Call("POST", "/v1/replays", _model(Replay), body=body, idempotent_create=True)


def get_replay(replay_id: str) -> Call[Replay]:
    return Call("GET", f"/v1/replays/{_id(replay_id)}", _model(Replay))


def list_replays(*, cursor: str | None, limit: int) -> Call[ReplayList]:
    return Call("GET", "/v1/replays", _model(ReplayList), params={**_query(cursor=cursor), "limit": limit})


def cancel_replay(replay_id: str) -> Call[Replay]:
    return Call("POST", f"/v1/replays/{_id(replay_id)}/cancel", _model(Replay))


def replay_runs(replay_id: str, *, cursor: str | None, limit: int) -> Call[ReplayRunList]:
    params = {**_query(cursor=cursor), "limit": limit}
    return Call("GET", f"/v1/replays/{_id(replay_id)}/runs", _model(ReplayRunList), params=params)


# --- bulk operations ---------------------------------------------------------------------------------

#: The largest page of a bulk operation's items.
MAX_ITEMS_PAGE = 1000


def bulk_body(
    target: str,
    action: str,
    filter: Mapping[str, Any],
    *,
    rate_per_sec: int | None = None,
    dry_run: bool = False,
    tenant_id: str | None = None,
) -> dict[str, Any]:
    """A bulk operation's request: the filter's keyword names in camelCase, instants in RFC 3339."""
    body: dict[str, Any] = {
        "target": target,
        "action": action,
        "filter": {to_camel(k): to_jsonable_python(v) for k, v in filter.items() if v is not None},
        "dryRun": dry_run,
    }
    if rate_per_sec is not None:
        body["ratePerSec"] = rate_per_sec
    if tenant_id is not None:
        body["tenantId"] = tenant_id
    return body


def create_bulk(body: Mapping[str, Any]) -> Call[BulkOperation]:
    return Call("POST", "/v1/bulk-operations", _model(BulkOperation), body=dict(body), idempotent_create=True)


def preview_bulk(body: Mapping[str, Any]) -> Call[BulkDryRun]:
    return Call("POST", "/v1/bulk-operations", _model(BulkDryRun), body={**body, "dryRun": True})


def get_bulk(operation_id: str) -> Call[BulkOperation]:
    return Call("GET", f"/v1/bulk-operations/{_id(operation_id)}", _model(BulkOperation))


def list_bulk(*, cursor: str | None, limit: int) -> Call[BulkOperationList]:
    params = {**_query(cursor=cursor), "limit": limit}
    return Call("GET", "/v1/bulk-operations", _model(BulkOperationList), params=params)


def cancel_bulk(operation_id: str) -> Call[BulkOperation]:
    return Call("POST", f"/v1/bulk-operations/{_id(operation_id)}/cancel", _model(BulkOperation))


def bulk_items(operation_id: str, *, outcome: str | None, cursor: str | None, limit: int) -> Call[BulkItemList]:
    params = {**_query(cursor=cursor, outcome=outcome), "limit": limit}
    return Call("GET", f"/v1/bulk-operations/{_id(operation_id)}/items", _model(BulkItemList), params=params)
