"""The FastAPI application: routers, error handling, tracing, and the resources one process holds.

:func:`create_app` builds an app from :class:`~sundial_api.settings.ApiSettings`; its lifespan opens one
asyncpg pool (shared by the :class:`~sundial_common.stores.Stores`) and one Redis connection pool (the
:class:`~sundial_common.hotwindow.window.HotWindow`) and closes them on shutdown. Replicas share nothing else,
so the API scales by running more of them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from redis.asyncio import Redis
from sundial_common.delivery.sender import Sender, SenderConfig
from sundial_common.domain.retry_policy import RetryPolicy
from sundial_common.hotwindow.rate_limits import TokenBuckets
from sundial_common.hotwindow.window import HotWindow
from sundial_common.hotwindow.worker_announcements import LiveWorkersCache, WorkerAnnouncements
from sundial_common.runtime.clock import Clock, SystemClock
from sundial_common.runtime.service import every
from sundial_common.security.auth import TokenVerifier
from sundial_common.security.encryption import open_keyring
from sundial_common.stores import Stores
from sundial_common.stores.notifications import DeliveryCaps
from sundial_common.stores.pool_cache import PoolCache

from sundial_api import (
    admin,
    audit,
    backfills,
    batch,
    breakers,
    bulk_operations,
    docs_ui,
    executions,
    health,
    job_keys,
    job_list,
    job_preview,
    jobs,
    notification_destinations,
    notification_email,
    openapi_document,
    pool_targets,
    pool_tokens,
    pool_workers,
    pools,
    problems,
    replays,
    stats,
    tenants,
)
from sundial_api import notifications as notifications_api
from sundial_api.change_feed import ChangeFeed
from sundial_api.console import install as install_console
from sundial_api.group_commit import HOT_WINDOW_MARGIN, CreateGroups
from sundial_api.input_guard import InputGuardMiddleware
from sundial_api.limits import BodyLimitMiddleware
from sundial_api.metrics import RequestMetricsMiddleware
from sundial_api.notification_delivery import NotificationDelivery, NotificationDeliveryConfig
from sundial_api.responses import OrjsonResponse
from sundial_api.settings import ApiSettings
from sundial_api.state import ApiState
from sundial_api.tenant_cache import TenantCache
from sundial_api.tracing import TracingMiddleware

log = logging.getLogger("sundial.api")

DESCRIPTION = """\
Sundial registers jobs — run once at an instant (`ONE_SHOT`) or after a delay (`DELAYED`), or recur on a
cron expression in a time zone (`CRON`), every N seconds (`INTERVAL`) or at listed instants (`RUN_LIST`) —
and fires every occurrence on time, handing it at least once to a named worker pool over Kafka. Each
occurrence is an **execution** with its attempts, worker, timestamps and an OpenTelemetry trace that runs
from this API request through the dispatcher to the handler.

**Authentication.** Every `/v1` call needs `Authorization: Bearer <jwt>`; the token names the tenant, and
a tenant sees only its own jobs and executions (anything else is 404).

**Errors** are RFC 9457 problem documents (`application/problem+json`) with `type`, `title`, `status`,
`detail` and `errors: [{"field", "message"}]`, where `field` is the dotted camelCase path of the input at
fault (`target.pool`, `runAt`, `cursor`, `body`). A failed request changes nothing.

**Instants** are RFC 3339; responses give them in UTC with `Z`. Fire times have millisecond precision.
"""

TAGS = [
    {
        "name": "jobs",
        "description": "Register, read, change, pause, resume, trigger and cancel jobs; preview schedules; "
        "page through executions.",
    },
    {"name": "executions", "description": "One occurrence of a job: state, attempts, worker, trace."},
    {
        "name": "replays",
        "description": "Replay a window of a pool's Kafka messages into a staging pool; follow and cancel it.",
    },
    {"name": "stats", "description": "The tenant's execution history from the ClickHouse replica."},
    {"name": "health", "description": "Liveness and readiness probes (no token needed)."},
    {"name": "tenants", "description": "The tenant registry: weight, quotas, suspension (admin token)."},
    {
        "name": "notifications",
        "description": "Webhooks told about incidents of the tenant's jobs (an execution DEAD …), signed with "
        "Standard Webhooks; their delivery log and a test send.",
    },
]


def _version() -> str:
    try:
        return version("sundial-api")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0"


def create_app(settings: ApiSettings | None = None, *, clock: Clock | None = None) -> FastAPI:
    """The API as an ASGI app. ``clock`` is injectable so tests can pin "now"."""
    settings = settings if settings is not None else ApiSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stores = await Stores.connect(
            settings.database_url, min_size=min(2, settings.db_pool_size), max_size=settings.db_pool_size
        )
        try:
            keyring = await open_keyring(settings, stores.keys)  # a wrong or missing master key stops here
        except BaseException:
            await stores.close()
            raise
        # Timeouts bound how long a sick Redis can hold a request: Redis is only a cache here.
        redis = Redis.from_url(
            settings.redis_url,
            socket_timeout=settings.redis_timeout_sec,
            socket_connect_timeout=settings.redis_timeout_sec,
        )
        hot_window = HotWindow(redis)
        wall = clock or SystemClock()
        notifications = NotificationDelivery(
            NotificationDeliveryConfig(
                concurrency=settings.notification_concurrency,
                caps=DeliveryCaps(
                    tenant_concurrency=settings.notification_tenant_concurrency,
                    destination_concurrency=settings.notification_destination_concurrency,
                    tenant_per_minute=settings.notification_tenant_per_minute,
                    destination_per_minute=settings.notification_destination_per_minute,
                ),
                retry=RetryPolicy(
                    max_attempts=settings.notification_max_attempts, initial_delay_ms=10_000, max_delay_ms=3_600_000
                ),
            ),
            stores.notifications,
            keyring,
            Sender(SenderConfig.from_settings(settings, settings.env)),
            settings.mail_relay(),
        )
        app.state.api = ApiState(
            settings=settings,
            stores=stores,
            hot_window=hot_window,
            clock=wall,
            tenant_cache=TenantCache(stores.tenants, settings.tenant_cache_sec),
            pool_cache=PoolCache(stores.pools, settings.tenant_cache_sec),
            live_workers=LiveWorkersCache(WorkerAnnouncements(redis), ttl_sec=1.0),
            buckets=TokenBuckets(redis),
            keyring=keyring,
            verifier=TokenVerifier.from_settings(settings),
            create_groups=CreateGroups(
                stores.jobs,
                hot_window,
                lambda: wall.now() + timedelta(seconds=settings.hot_window_sec) + HOT_WINDOW_MARGIN,
                max_jobs=settings.create_group_max,
                writers=settings.create_group_writers,
            ),
            changes=ChangeFeed(stores.audit),
            notifications=notifications,
        )
        log.info("api ready (shards=%d, hot window=%ds)", settings.shards, settings.hot_window_sec)
        stop_delivering = asyncio.Event()
        delivering = asyncio.create_task(
            every(
                stop_delivering,
                notifications.config.interval_sec,
                notifications.run_once,
                name="notifications",
                idle_interval=notifications.config.idle_interval_sec,
            ),
            name="notifications",
        )
        try:
            yield
        finally:
            stop_delivering.set()
            await delivering
            await notifications.sender.close()
            await app.state.api.changes.stop()
            await redis.aclose()
            await stores.close()
            # Export the spans still queued here: after a graceful SIGTERM shutdown uvicorn re-raises the
            # signal, and the process dies without running atexit hooks.
            provider = trace.get_tracer_provider()
            if isinstance(provider, TracerProvider):
                await asyncio.to_thread(provider.force_flush)

    app = FastAPI(
        title="Sundial",
        summary="A distributed job scheduler: register jobs over HTTP, run them on your worker pools.",
        description=DESCRIPTION,
        version=_version(),
        openapi_tags=TAGS,
        lifespan=lifespan,
        default_response_class=OrjsonResponse,
        # Swagger UI (/docs) and ReDoc (/redoc) are installed by docs_ui, with assets served from this process.
        docs_url=None,
        redoc_url=None,
        # FastAPI's own OpenTelemetry instrumentation would open a second SERVER span per request (and two
        # INTERNAL ones, on the benchmark path); Sundial's request span is TracingMiddleware's, which
        # names and shapes it the way the dispatcher and the worker continue it.
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    problems.install(app)
    docs_ui.install(app)
    # Whole-request limit: 413 before the body is parsed. The payload's own, smaller limit is checked
    # after parsing, where the field can be named. Tracing goes outermost so that 413s are traced too.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    # Before routing: a NUL character in the path or the query (which no stored value can hold) is a 404 or 422.
    app.add_middleware(InputGuardMiddleware)
    app.add_middleware(TracingMiddleware)
    # Outermost: the request counts and durations include every middleware's answer (a 413, a 500).
    app.add_middleware(RequestMetricsMiddleware)
    app.include_router(batch.router)  # before jobs: `/v1/jobs:batch` must not match `/v1/jobs/{id}`
    app.include_router(job_keys.router)
    # Before jobs too: for `/v1/jobs/{id}:backfill` the first route matching the path is the one whose methods a
    # 405 (an OPTIONS, say) lists, not `GET /v1/jobs/{id}`'s.
    app.include_router(backfills.router)
    app.include_router(jobs.create_router)
    app.include_router(jobs.router)
    app.include_router(job_list.router)
    app.include_router(job_preview.router)
    app.include_router(job_preview.schedules_router)
    app.include_router(executions.router)
    app.include_router(health.router)
    app.include_router(admin.router)
    app.include_router(replays.router)
    app.include_router(bulk_operations.router)
    app.include_router(stats.router)
    app.include_router(tenants.router)
    app.include_router(audit.router)
    app.include_router(pools.admin_router)
    app.include_router(pools.router)
    app.include_router(pool_workers.router)
    app.include_router(pool_tokens.router)
    app.include_router(pool_targets.router)
    app.include_router(pool_targets.completions)
    app.include_router(breakers.router)
    app.include_router(notifications_api.router)
    app.include_router(notification_email.router)
    app.include_router(notification_destinations.router)
    install_console(app)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = openapi_document.corrected(
                get_openapi(
                    title=app.title,
                    version=app.version,
                    summary=app.summary,
                    description=app.description,
                    routes=app.routes,
                    tags=app.openapi_tags,
                )
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
