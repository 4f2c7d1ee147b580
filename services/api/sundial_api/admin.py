"""``/v1/admin``: operator endpoints (admin tokens only) — for now the cluster view, ``GET /v1/admin/cluster``.

The router brings its own lifespan (FastAPI merges it into the app's): an etcd client for the cluster
view, and — for a replica started by ``sundial api`` — this replica's entry in the etcd registry, kept
in a background task that retries while etcd is away, because the API must serve jobs whether or not
etcd answers. Apps built in tests do not register unless :func:`register_replica` asked for it, so a
test never shows up in a development cluster's registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aetcd
from fastapi import APIRouter, FastAPI, Request
from starlette.responses import Response
from sundial_common.coordination.cluster import read_cluster
from sundial_common.coordination.registry import LeftRegistry, ReplicaRecord, ReplicaRegistration, etcd_client

from sundial_api.auth import Authenticated
from sundial_api.json_body import JsonRoute
from sundial_api.models.admin import ClusterView
from sundial_api.problems import ProblemError, responses
from sundial_api.responses import OrjsonResponse
from sundial_api.state import State

log = logging.getLogger("sundial.api")

# The cluster view reads etcd, Postgres and Redis; an operator waiting longer than this learns more from a 503.
CLUSTER_VIEW_TIMEOUT_SEC = 5.0
_REGISTER_RETRY_SEC = 2.0


def register_replica(app: FastAPI) -> None:
    """Make ``app`` register itself in the etcd registry while it runs (``sundial api`` calls this)."""
    app.state.register_replica = True


async def _keep_registered(registration: ReplicaRegistration, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            await registration.register()
        except (aetcd.ClientError, TimeoutError) as exc:
            log.warning("api replica not registered in etcd yet (%r); retrying", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _REGISTER_RETRY_SEC)
            continue
        except LeftRegistry:
            return
        await registration.run(stop)
        return


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings = app.state.api.settings
    etcd = etcd_client(settings.etcd_endpoint)
    app.state.admin_etcd = etcd
    stop = asyncio.Event()
    keeper: asyncio.Task[None] | None = None
    registration: ReplicaRegistration | None = None
    if getattr(app.state, "register_replica", False):
        registration = ReplicaRegistration(
            etcd, ReplicaRecord.for_this_process("api", settings.instance_id), ttl_sec=settings.lease_ttl_sec
        )
        keeper = asyncio.create_task(_keep_registered(registration, stop), name="sundial-api-registry")
    try:
        yield
    finally:
        stop.set()
        if keeper is not None and registration is not None:
            await registration.deregister()
            keeper.cancel()
            await asyncio.wait({keeper})
        await etcd.close()


router = APIRouter(prefix="/v1/admin", tags=["admin"], lifespan=_lifespan, route_class=JsonRoute)


@router.get(
    "/cluster",
    response_model=ClusterView,
    responses=responses(401, 403, 503),
    summary="Replicas, shard leaders, fence tokens, lease TTLs and hot-window sizes (admin token)",
)
async def cluster(request: Request, state: State, principal: Authenticated) -> Response:
    if not principal.admin:
        raise ProblemError(403, "this endpoint needs an admin token (`sundial token --tenant <t> --admin`)")
    etcd: aetcd.Client = request.app.state.admin_etcd
    try:
        view = await asyncio.wait_for(
            read_cluster(etcd, state.settings.shards, hot_window=state.hot_window, dispatch=state.stores.dispatch),
            CLUSTER_VIEW_TIMEOUT_SEC,
        )
    except (aetcd.ClientError, TimeoutError) as exc:
        raise ProblemError(
            503, f"etcd at {state.settings.etcd_endpoint} did not answer: {type(exc).__name__}"
        ) from None
    return OrjsonResponse(view.to_json())
