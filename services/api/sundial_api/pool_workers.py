"""Who serves a pool, as the API tells it: ``GET /v1/pools/{name}``, an execution's ``waitingFor``, a job's warnings.

Everything here reads the workers' announcements (:mod:`sundial_common.hotwindow.worker_announcements`, through the
state's one-second cache) and words what they mean with :mod:`sundial_common.coordination.pool_service`, which
holds the one definition of "a pool has work and no live worker". Sundial tells the user *before* they wait:

- ``GET /v1/pools/{name}`` (a pool the caller's tenant may use): its live workers with their handlers and free
  slots, the caller's own backlog, and a warning while that backlog waits in a pool nobody reads;
- ``GET /v1/executions/{id}`` of a PENDING execution says ``waitingFor: "no live worker in pool <name>"`` then;
- a job created or changed (``POST``/``PATCH /v1/jobs``) whose handler no live worker of its pool serves is
  **accepted with a warning**, not refused: workers are often deployed after the jobs that need them (a rolling
  deploy, a pool scaled to zero overnight), and a refusal would force that order on every deployment. The warning
  says which handlers the live workers do serve, so a typo is plain at once.

Redis trouble never fails these reads: without announcements the API says nothing rather than something false.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Path
from redis.exceptions import RedisError
from starlette.responses import Response
from sundial_common.coordination.pool_service import PoolService, handler_warning, pool_service, waiting_for
from sundial_common.hotwindow.worker_announcements import WorkerAnnouncement

from sundial_api.auth import Authenticated
from sundial_api.models.pools import PoolDetail, render_pool, render_worker
from sundial_api.problems import ProblemError, responses
from sundial_api.responses import OrjsonResponse
from sundial_api.state import ApiState, State

log = logging.getLogger("sundial.api")

router = APIRouter(prefix="/v1/pools", tags=["pools"])

_REDIS_TROUBLE = (RedisError, OSError, TimeoutError)


async def live_workers(state: ApiState, pool: str) -> list[WorkerAnnouncement] | None:
    """The pool's live workers, or None if Redis cannot say now (then nothing is claimed about them)."""
    try:
        return await state.live_workers.live(pool)
    except _REDIS_TROUBLE as exc:
        log.warning("live workers of pool %s unknown: %r", pool, exc, extra={"pool": pool})
        return None


async def job_warnings(state: ApiState, pool: str, handler: str) -> list[dict[str, str]]:
    """The warnings of a job sent to ``handler`` in ``pool``: one if no live worker of the pool serves it."""
    workers = await live_workers(state, pool)
    warning = handler_warning(pool, handler, workers) if workers is not None else None
    return [{"field": "target.handler", "message": warning}] if warning else []


async def execution_waiting_for(state: ApiState, pool: str, execution_state: str) -> str | None:
    """What a PENDING execution of ``pool`` waits for when nothing can start it; None otherwise."""
    if execution_state != "PENDING":
        return None
    workers = await live_workers(state, pool)
    return waiting_for(pool, workers) if workers is not None else None


PoolName = Annotated[str, Path(description="The pool's name.")]


@router.get(
    "/{name}",
    response_model=PoolDetail,
    responses=responses(401, 404, 503),
    summary="A pool the caller's tenant may use: its live workers and the caller's backlog",
)
async def get_pool(name: PoolName, state: State, principal: Authenticated) -> Response:
    """A pool that is not registered, or that the caller's tenant may not use, is not found (404)."""
    pool = await state.pool_cache.get(name)
    if pool is None or not pool.admits(principal.tenant):
        pool = await state.pool_cache.recheck(name)
    if pool is None or not pool.admits(principal.tenant):
        raise ProblemError(404, f"pool {name} not found (not registered, or not open to tenant {principal.tenant})")
    try:
        service = await pool_service(state.live_workers.announcements, state.stores.executions, name, principal.tenant)
    except _REDIS_TROUBLE as exc:
        raise ProblemError(503, f"the live workers of pool {name} cannot be read now: {exc}") from None
    view = render_pool(pool)
    if pool.shared_with:  # a tenant learns that a pool is shared, not with whom
        view["sharedWith"] = [principal.tenant]
    view.update(render_service(service))
    return OrjsonResponse(view)


def render_service(service: PoolService) -> dict[str, object]:
    return {
        "workers": {
            "live": service.live_workers,
            "freeSlots": service.free_slots,
            "handlers": list(service.handlers),
            "items": [render_worker(w) for w in service.workers],
        },
        "backlog": {"pending": service.pending, "oldestPendingAt": service.oldest_pending_at},
        "warnings": [f"{waiting_for(service.pool, ())}: {service.pending} of your executions wait for one"]
        if service.unserved
        else [],
    }
