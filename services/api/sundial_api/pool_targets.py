"""``/v1/pools/{name}/target``: where an HTTP pool's executions are POSTed, set by the pool's owner; and
``/v1/targets/{name}/completions/…``: how a target that answered ``202`` finishes the attempt later.

An admin registers a pool with ``delivery: http``; its owning tenant (or an admin) then sets the target: a base URL,
optional per-handler paths, and a signing secret made here, answered once and stored sealed under the owner's data
key, as the notification secrets are. The URL is checked as a notification's is (``https`` outside development, an
address requests may reach: 422 naming ``url``) and again at every delivery. A shared pool has no target: its
secret would be sealed under one tenant's key while every sharing tenant's work went through it.

**Completion.** A delivery worker whose POST was answered ``202`` leaves the attempt RUNNING; the request carried
this URL and a token derived from the target's secret (:mod:`sundial_common.delivery.targets`). The target POSTs
the outcome here with ``Authorization: Bearer <token>``: checked in constant time, then written with the worker's
own finish compare-and-swap (``executions.finish_attempts`` under the delivery worker's identity), so a completion
after the sweeper timed the attempt out, or a second one, is refused (409).
"""

from __future__ import annotations

import logging
import re
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Header, Path
from starlette.responses import Response
from sundial_client.models.pools import PoolTargetView
from sundial_common.delivery.address_policy import AddressRefused
from sundial_common.delivery.sender import URLRefused
from sundial_common.delivery.signing import new_secret
from sundial_common.delivery.targets import SEALED_SECRETS, check_completion_token
from sundial_common.domain.retry_policy import RetryPolicy
from sundial_common.security.auth import Principal
from sundial_common.security.encryption import RESULT
from sundial_common.stores.executions import NO_RETRY, Outcome
from sundial_common.stores.pools import HTTP, Pool

from sundial_api.auth import Authenticated
from sundial_api.json_body import JsonRoute
from sundial_api.models.targets import Completion, TargetPut, render_target
from sundial_api.problems import ProblemError, invalid, responses
from sundial_api.responses import OrjsonResponse
from sundial_api.state import ApiState, State

log = logging.getLogger("sundial.api")

router = APIRouter(prefix="/v1/pools/{name}/target", tags=["pools"], route_class=JsonRoute)
completions = APIRouter(prefix="/v1/targets", tags=["pools"], route_class=JsonRoute)

PoolName = Annotated[str, Path(description="The pool's name.")]
_HANDLER = re.compile(r"^\S(?:.{0,198}\S)?$")
_PATH = re.compile(r"^[A-Za-z0-9._~!$&'()*+,;=:@%/-]{1,512}$")


async def _owned_http_pool(state: ApiState, principal: Principal, name: str) -> Pool:
    """``name`` if ``principal`` may manage its target: an admin, or the tenant that owns it (403 otherwise, 404 to
    them when it is not registered); 409 unless its delivery is ``http``, 422 for a shared pool."""
    pool = await state.pool_cache.recheck(name)
    if pool is None and principal.admin:
        raise ProblemError(404, f"pool {name} is not registered")
    if pool is None or not (principal.admin or pool.owner == principal.tenant):
        raise ProblemError(
            403, f"pool `{name}`'s target is not yours to manage: it is not owned by your tenant", slug="pool-forbidden"
        )
    if pool.owner is None:
        raise invalid("name", f"pool `{name}` is shared: only a pool owned by one tenant has an HTTP target")
    if pool.delivery != HTTP:
        raise ProblemError(
            409,
            f"pool `{name}` is delivered by workers (`delivery: {pool.delivery}`); an admin sets `delivery: http` "
            "first",
        )
    return pool


def _check_paths(paths: dict[str, str]) -> dict[str, str]:
    for handler, path in paths.items():
        if not _HANDLER.fullmatch(handler):
            raise invalid(f"paths.{handler}", "is not a handler name (1-200 characters, no surrounding whitespace)")
        if not _PATH.fullmatch(path) or "//" in path or any(part in (".", "..") for part in path.split("/")):
            raise invalid(
                f"paths.{handler}",
                f"{path!r} is not a relative path under `url` (URL path characters, no `//`, `.` or `..` segments, "
                "no query)",
            )
    return paths


@router.put(
    "",
    response_model=PoolTargetView,
    responses=responses(401, 403, 404, 409, 422, 503),
    summary="Set where an HTTP pool's executions are POSTed (the pool's owner; a new secret is answered once)",
)
async def put_target(name: PoolName, body: TargetPut, state: State, principal: Authenticated) -> Response:
    pool = await _owned_http_pool(state, principal, name)
    assert pool.owner is not None
    paths = _check_paths(body.paths or {})  # before the URL's check, which may wait for DNS
    try:
        await state.notifications.sender.check_destination(body.url)
    except (URLRefused, AddressRefused) as exc:
        raise invalid("url", str(exc)) from None
    cipher = await state.keyring.cipher(pool.owner)
    current = await state.stores.pool_targets.get_target(name)
    new = current is None or body.rotate_secret or current.tenant_id != pool.owner
    secret = new_secret() if current is None or new else cipher.open_json(current.sealed_secrets, SEALED_SECRETS)[0]
    sealed = cipher.seal_json([secret], SEALED_SECRETS) if new else None
    target = await state.stores.pool_targets.put_target(name, pool.owner, body.url, paths, sealed, principal.subject)
    log.info("pool %s target set%s", name, " (new secret)" if new else "", extra={"pool": name})
    return OrjsonResponse(
        render_target(target, secret, new=new),
        status_code=201 if current is None else 200,
        headers={"Cache-Control": "no-store"},
    )


@router.get(
    "",
    response_model=PoolTargetView,
    responses=responses(401, 403, 404, 409, 503),
    summary="An HTTP pool's target (its secret redacted)",
)
async def get_target(name: PoolName, state: State, principal: Authenticated) -> Response:
    pool = await _owned_http_pool(state, principal, name)
    assert pool.owner is not None
    target = await state.stores.pool_targets.get_target(name)
    if target is None:
        raise ProblemError(404, f"pool {name} has no target yet (PUT /v1/pools/{name}/target)")
    cipher = await state.keyring.cipher(target.tenant_id)
    return OrjsonResponse(render_target(target, cipher.open_json(target.sealed_secrets, SEALED_SECRETS)[0], new=False))


@completions.post(
    "/{name}/completions/{execution_id}/{attempt}",
    status_code=204,
    responses=responses(401, 409, 422, 503),
    summary="Finish an attempt an HTTP target accepted (202), with the completion token its request carried",
)
async def complete(
    name: PoolName,
    execution_id: Annotated[UUID, Path(description="The execution (`executionId` of the request).")],
    attempt: Annotated[int, Path(ge=1, description="The attempt (`attempt` of the request).")],
    body: Completion,
    state: State,
    authorization: Annotated[str | None, Header(description="`Bearer <completionToken>`.")] = None,
) -> Response:
    token = (authorization or "").removeprefix("Bearer ").strip()
    target = await state.stores.pool_targets.get_target(name)
    row = None
    if token and target is not None:
        row = await state.stores.executions.get_execution(target.tenant_id, execution_id)
    # The same answer for an unknown pool, execution or attempt and a wrong token: a guess learns nothing.
    if target is None or row is None or row["pool"] != name:
        raise ProblemError(401, "no attempt of this pool matches this execution, attempt and completion token")
    cipher = await state.keyring.cipher(target.tenant_id)
    if not check_completion_token(
        cipher.open_json(target.sealed_secrets, SEALED_SECRETS), execution_id, attempt, token
    ):
        raise ProblemError(401, "no attempt of this pool matches this execution, attempt and completion token")
    if row["state"] != "RUNNING" or row["attempt"] != attempt or not row["worker_id"]:
        raise ProblemError(409, f"attempt {attempt} is over already (the execution is {row['state']})")
    if body.outcome == "succeeded":
        outcome = Outcome(execution_id, attempt, "SUCCEEDED", cipher.seal_json(body.result, RESULT))
    else:
        delay = NO_RETRY
        if body.retry:
            job = await state.stores.jobs.get_job(target.tenant_id, row["job_id"])
            delay = RetryPolicy.from_json(job["retry_policy"] if job else None).delay_ms(attempt)
        error = cipher.seal_error(f"TargetFailed: {body.error or 'the target reported a failure'}")
        outcome = Outcome(execution_id, attempt, "FAILED", None, error, delay)
    # The delivery worker's own compare-and-swap, under its identity: at most one end of the attempt is accepted.
    finished = await state.stores.executions.finish_attempts(row["worker_id"], [outcome])
    if not finished:
        raise ProblemError(409, f"attempt {attempt} is over already (completed, timed out or cancelled)")
    log.info("accepted attempt %d of %s completed: %s", attempt, execution_id, body.outcome, extra={"pool": name})
    return Response(status_code=204)
