"""The worker gateway's HTTP API: what a worker holding only a pool token calls to run its pool's work.

- ``POST /v1/worker/pull`` — long poll: executions started for the caller (:mod:`sundial_gateway.pulls`);
- ``POST /v1/worker/heartbeat`` — renew running attempts, report progress, learn which to stop;
- ``POST /v1/worker/finish`` — outcomes, each accepted or rejected (:mod:`sundial_gateway.attempts`);
- ``POST /v1/worker/token`` — a fresh pool token for the one presented (same registry entry, new expiry);
- ``GET /healthz`` — the process answers; ``GET /readyz`` — it has opened its stores and serves calls.

Every ``/v1/worker`` call is authorised by a pool token (:mod:`sundial_gateway.access`): a missing, expired,
revoked, tenant or admin token is 401, a pool that no longer admits the token's tenant 403, too many requests 429.
Errors are ``application/problem+json`` with ``detail`` and, for bad input, ``errors`` naming each field (422).
The process holds no state a caller depends on: any replica serves any call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from redis.asyncio import Redis
from sundial_common.hotwindow.rate_limits import TokenBuckets
from sundial_common.hotwindow.worker_announcements import WorkerAnnouncements
from sundial_common.security.auth import symmetric_keys
from sundial_common.security.encryption import open_keyring
from sundial_common.security.pool_tokens import PoolGrant, PoolTokenVerifier, issue_pool_token
from sundial_common.stores import Stores
from sundial_common.stores.pool_cache import PoolCache

from sundial_gateway import leases, telemetry
from sundial_gateway.access import Access, Refused
from sundial_gateway.attempts import AttemptLimits, Attempts, TooLarge
from sundial_gateway.hooks import PauseHook
from sundial_gateway.models import (
    FinishRequest,
    FinishResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    PullRequest,
    PullResponse,
    TokenResponse,
)
from sundial_gateway.presence import Announced, Presence
from sundial_gateway.pulls import PullConfig, Pulls
from sundial_gateway.settings import GatewaySettings

log = logging.getLogger("sundial.gateway")

#: How often idle feeds are looked at (and leave their group).
_JANITOR_SEC = 0.5
_PROBLEM = "application/problem+json"


@dataclass(slots=True)
class GatewayState:
    settings: GatewaySettings
    access: Access
    pulls: Pulls
    attempts: Attempts
    hook: PauseHook
    presence: Presence


def _problem(
    status: int, detail: str, *, errors: list[dict[str, str]] | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    body: dict[str, Any] = {"type": "about:blank", "status": status, "detail": detail}
    if errors:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, media_type=_PROBLEM, headers=headers or None)


async def _state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


State = Annotated[GatewayState, Depends(_state)]


class Problem(BaseModel):
    """An error: its HTTP ``status``, what went wrong (``detail``) and, for bad input, each field at fault."""

    type: str = "about:blank"
    status: int
    detail: str
    errors: list[dict[str, str]] | None = None


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "Missing, invalid, expired or revoked pool token (or not a pool token)."},
    403: {"model": Problem, "description": "The token's pool no longer admits its tenant (or is not registered)."},
    422: {"model": Problem, "description": "Invalid input; `errors` names each field at fault."},
    429: {"model": Problem, "description": "Over the token's request rate; `Retry-After` says when to come back."},
}


@dataclass(frozen=True, slots=True)
class Caller:
    grant: PoolGrant
    #: Whether the token's pool is shared (its gateways then read in a group per tenant).
    shared: bool


_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="poolToken",
    bearerFormat="JWT",
    description="A pool token (`sundial pools token create POOL` mints one; `POST /v1/worker/token` refreshes it).",
)


async def _caller(
    state: State, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Caller:
    grant = await state.access.grant(None if credentials is None else f"Bearer {credentials.credentials}")
    pool = await state.access.pools.get(grant.pool)
    return Caller(grant, shared=pool is not None and pool.owner is None)


Authorized = Annotated[Caller, Depends(_caller)]


def create_app(settings: GatewaySettings | None = None) -> FastAPI:
    settings = settings if settings is not None else GatewaySettings()
    keys = symmetric_keys(settings)
    if not keys:
        raise ValueError("the gateway needs an HS256 key (SUNDIAL_JWT_SECRET or SUNDIAL_JWT_KEYS) for pool tokens")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stores = await Stores.connect(settings.database_url, min_size=1, max_size=settings.gateway_db_pool_size)
        redis = Redis.from_url(
            settings.redis_url,
            socket_timeout=settings.gateway_redis_timeout_sec,
            socket_connect_timeout=settings.gateway_redis_timeout_sec,
        )
        try:
            keyring = await open_keyring(settings, stores.keys)
            hook = PauseHook(settings.gateway_test_pause_at, settings.gateway_test_pause_sec)
            pool_cache = PoolCache(stores.pools, settings.gateway_token_cache_sec)
            access = Access(
                PoolTokenVerifier(keys, leeway_sec=settings.jwt_leeway_sec),
                stores.pool_tokens,
                pool_cache,
                TokenBuckets(redis),
                cache_sec=settings.gateway_token_cache_sec,
                rate_per_token=settings.gateway_rate_per_token,
            )
            pulls = Pulls(
                PullConfig(
                    settings.kafka_bootstrap,
                    f"sundial-gateway-{settings.instance_id}",
                    settings.gateway_session_timeout_sec,
                    settings.gateway_leave_after_sec,
                    settings.gateway_heartbeat_ttl_sec,
                ),
                stores.executions,
                redis,
                keyring,
                keys[0],
                hook,
            )
            attempts = Attempts(
                AttemptLimits(
                    heartbeat_ttl_sec=settings.gateway_heartbeat_ttl_sec,
                    timeout_grace_sec=settings.gateway_timeout_grace_sec,
                    max_result_bytes=settings.gateway_max_result_bytes,
                    max_progress_bytes=settings.gateway_max_progress_bytes,
                    max_traceback_chars=settings.gateway_max_traceback_chars,
                    max_log_tail_chars=settings.gateway_max_log_tail_chars,
                    hot_window_sec=settings.hot_window_sec,
                ),
                stores.executions,
                redis,
                keyring,
                keys,
            )
        except BaseException:
            await redis.aclose()
            await stores.close()
            raise
        presence = Presence(WorkerAnnouncements(redis))
        app.state.gateway = GatewayState(settings, access, pulls, attempts, hook, presence)
        janitor = asyncio.create_task(_janitor(pulls), name="sundial-gateway-janitor")
        log.info("gateway ready")
        try:
            yield
        finally:
            janitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await janitor
            await pulls.close()
            await redis.aclose()
            await stores.close()

    app = FastAPI(
        title="Sundial worker gateway",
        summary="Workers in any language, holding only a pool token, run a pool's work over HTTP.",
        version="0.1.0",
        lifespan=lifespan,
        # The gateway's request span is its own (sundial_gateway.telemetry: pool, tenant, counts, links to each
        # execution's trace); FastAPI's instrumentation would add a second SERVER span and INTERNAL ones per call.
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
        openapi_tags=[
            {
                "name": "worker",
                "description": "Pull executions started for you, heartbeat them while they run, finish them. A "
                "worker keeps one random `session` id for its life and sends it with every call.",
            }
        ],
    )
    _install_errors(app)
    _routes(app)
    return app


def _announced(body: PullRequest, request: Request) -> Announced:
    """What a pull says of its worker (without ``worker``: ``max`` slots, all free)."""
    host = request.client.host if request.client is not None else ""
    info = body.worker
    if info is None:
        return Announced(body.max, body.max, host=host)
    return Announced(info.concurrency, info.free_slots, tuple(info.handlers), info.version, host)


async def _janitor(pulls: Pulls) -> None:
    while True:
        await asyncio.sleep(_JANITOR_SEC)
        try:
            await pulls.leave_idle()
        except Exception:  # a broker hiccup must not stop the janitor: the next pass tries again
            log.exception("leaving idle consumer groups failed")


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(Refused)
    async def refused(_request: Request, exc: Refused) -> JSONResponse:
        headers: dict[str, str] = {}
        if exc.status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="sundial-worker"'
        if exc.status == 429:
            headers["Retry-After"] = str(max(1, -(-exc.retry_after_ms // 1000)))
        return _problem(exc.status, exc.reason, headers=headers)

    @app.exception_handler(TooLarge)
    async def too_large(_request: Request, exc: TooLarge) -> JSONResponse:
        return _problem(422, f"{exc.field} {exc}", errors=[{"field": exc.field, "message": str(exc)}])

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = []
        for error in exc.errors():
            location = [str(part) for part in error.get("loc", ()) if part != "body"]
            field = ".".join(location) or "body"
            errors.append({"field": field, "message": str(error.get("msg", "is invalid"))})
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return _problem(422, f"invalid request: {detail}", errors=errors)


def _routes(app: FastAPI) -> None:
    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False, response_model=None)
    async def readyz(request: Request) -> dict[str, str] | JSONResponse:
        if getattr(request.app.state, "gateway", None) is None:
            return _problem(503, "the gateway is starting: its stores and keys are not open yet")
        return {"status": "ready"}

    @app.post(
        "/v1/worker/pull",
        tags=["worker"],
        responses=_ERRORS,
        response_model=PullResponse,
        summary="Long poll: executions of the token's pool started for this caller",
    )
    async def pull(body: PullRequest, request: Request, state: State, caller: Authorized) -> dict[str, Any]:
        settings = state.settings
        most = min(body.max, settings.gateway_max_pull)
        wait_sec = min(body.wait_ms, settings.gateway_max_wait_ms) / 1000
        began = time.monotonic()
        await state.presence.pulled(
            caller.grant.pool, leases.worker_id(caller.grant, body.session), _announced(body, request)
        )
        with telemetry.request_span("/v1/worker/pull", caller.grant) as span, telemetry.polling(caller.grant.pool):
            leased = await state.pulls.pull(caller.grant, caller.shared, body.session, most, wait_sec)
            span.set_attribute("sundial.executions", len(leased))
        telemetry.pulled(caller.grant.pool, len(leased), time.monotonic() - began)
        if leased:
            await state.hook.reach("start")
        return {"executions": leased}

    @app.post(
        "/v1/worker/heartbeat",
        tags=["worker"],
        responses=_ERRORS,
        response_model=HeartbeatResponse,
        summary="Renew running attempts (with their progress); answers which to stop",
    )
    async def heartbeat(body: HeartbeatRequest, state: State, caller: Authorized) -> dict[str, Any]:
        with telemetry.request_span("/v1/worker/heartbeat", caller.grant) as span:
            span.set_attribute("sundial.executions", len(body.running))
            running = await state.attempts.heartbeat(caller.grant, body)
        # A worker busy with long handlers pulls rarely: its heartbeats keep it announced and its feed in the group.
        state.pulls.touch(caller.grant, caller.shared)
        worker = leases.worker_id(caller.grant, body.session)
        await state.presence.renewed(caller.grant.pool, worker, sum(1 for r in running if r["renewed"]))
        telemetry.heartbeated(caller.grant.pool, running)
        return {"running": running}

    @app.post(
        "/v1/worker/finish",
        tags=["worker"],
        responses=_ERRORS,
        response_model=FinishResponse,
        summary="Record how attempts ended; each is accepted or rejected by the start's owner check",
    )
    async def finish(body: FinishRequest, state: State, caller: Authorized) -> dict[str, Any]:
        with telemetry.request_span("/v1/worker/finish", caller.grant) as span:
            span.set_attribute("sundial.executions", len(body.outcomes))
            outcomes = await state.attempts.finish(caller.grant, body)
        telemetry.finished(caller.grant.pool, outcomes)
        await state.hook.reach("finish")
        return {"outcomes": outcomes}

    @app.post(
        "/v1/worker/token",
        tags=["worker"],
        responses=_ERRORS,
        response_model=TokenResponse,
        summary="A fresh pool token for the one presented (refresh it before it expires)",
    )
    async def refresh(state: State, caller: Authorized) -> dict[str, Any]:
        grant = caller.grant
        key = symmetric_keys(state.settings)[0]
        now = datetime.now(UTC).timestamp()
        token = issue_pool_token(
            key,
            token_id=grant.token_id,
            pool=grant.pool,
            tenant=grant.tenant,
            subject=grant.subject,
            ttl_sec=grant.ttl_sec,
            now=now,
        )
        return {"token": token, "expiresAt": datetime.fromtimestamp(int(now) + grant.ttl_sec, UTC)}
