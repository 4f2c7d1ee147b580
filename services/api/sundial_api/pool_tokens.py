"""Pool tokens over HTTP: minting, listing and revoking the credentials of workers behind the worker gateway.

``POST /v1/pools/{name}/tokens`` mints one (:mod:`sundial_common.security.pool_tokens`): an admin for any pool, or
the owning tenant for a pool it owns. A pool token takes the work of one tenant only: an owned pool's owner, or —
for a shared pool, where only an admin mints — the sharing tenant the body names, so a worker for tenant A of a
shared pool never sees tenant B's work. Staging pools get none (their workers run replays, which the gateway does
not serve). The JWT is in the answer once; the registry (``pool_tokens``) keeps its id, pool, tenant and lifetime,
which the gateway checks on every use. ``GET …/tokens`` lists a pool's tokens, ``DELETE …/tokens/{id}`` revokes
one (again: 204, nothing changes) — within the gateway's registry cache (2 s) it is refused everywhere.
"""

from __future__ import annotations

import logging
import secrets
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query
from starlette.responses import Response
from sundial_client.models.pools import PoolTokenIssued, PoolTokenList
from sundial_common.security.auth import Principal, symmetric_keys
from sundial_common.security.pool_tokens import issue_pool_token
from sundial_common.stores.pools import Pool

from sundial_api.auth import Authenticated
from sundial_api.json_body import JsonRoute
from sundial_api.models.pools import PoolTokenCreate, render_pool_token
from sundial_api.problems import ProblemError, field_error, invalid, responses
from sundial_api.responses import OrjsonResponse
from sundial_api.state import ApiState, State

log = logging.getLogger("sundial.api")

router = APIRouter(prefix="/v1/pools/{name}/tokens", tags=["pools"], route_class=JsonRoute)

PoolName = Annotated[str, Path(description="The pool's name.")]
TokenId = Annotated[str, Path(description="The token's id (`id` when it was minted).", max_length=64)]


async def _managed_pool(state: ApiState, principal: Principal, name: str) -> Pool:
    """The pool ``name`` if ``principal`` may manage its tokens: an admin, or the tenant that owns it (else 403;
    404 when it is not registered — said to an admin or the owner only, so a tenant learns nothing of others')."""
    pool = await state.pool_cache.recheck(name)
    if principal.admin:
        if pool is None:
            raise ProblemError(404, f"pool {name} is not registered")
        return pool
    if pool is None or pool.owner != principal.tenant:
        shared = pool is not None and principal.tenant in pool.shared_with
        reason = "only an admin manages the tokens of a shared pool" if shared else "it is not owned by your tenant"
        raise ProblemError(403, f"pool `{name}` tokens are not yours to manage: {reason}", slug="pool-forbidden")
    return pool


def _token_tenant(pool: Pool, asked: str | None) -> str:
    """The tenant a new token of ``pool`` serves (422 naming `tenant` when it cannot)."""
    if pool.owner is not None:
        if asked is not None and asked != pool.owner:
            raise invalid("tenant", f"pool `{pool.name}` is owned by {pool.owner}: its tokens take that tenant's work")
        return pool.owner
    if asked is None:
        raise invalid(
            "tenant",
            f"pool `{pool.name}` is shared: name the one tenant whose work the token takes "
            f"({', '.join(pool.shared_with)})",
        )
    if asked not in pool.shared_with:
        raise invalid("tenant", f"pool `{pool.name}` is not shared with {asked}")
    return asked


@router.post(
    "",
    status_code=201,
    response_model=PoolTokenIssued,
    responses=responses(401, 403, 404, 422, 503),
    summary="Mint a pool token for workers behind the worker gateway (admin, or the pool's owner)",
)
async def create_pool_token(name: PoolName, body: PoolTokenCreate, state: State, principal: Authenticated) -> Response:
    pool = await _managed_pool(state, principal, name)
    if pool.staging:
        message = f"pool `{name}` is a staging pool: its workers run replays, which the worker gateway does not serve"
        raise ProblemError(422, message, errors=[field_error("name", message)])
    tenant = _token_tenant(pool, body.tenant)
    keys = symmetric_keys(state.settings)
    if not keys:
        raise ProblemError(503, "no HS256 key to sign pool tokens with (SUNDIAL_JWT_SECRET or SUNDIAL_JWT_KEYS)")
    subject = body.subject or f"{name}-worker"
    record = await state.stores.pool_tokens.create_token(
        f"pt_{secrets.token_urlsafe(18)}", name, tenant, subject, principal.subject, body.ttl_sec
    )
    now = state.clock.now()
    token = issue_pool_token(
        keys[0],
        token_id=record.id,
        pool=name,
        tenant=tenant,
        subject=subject,
        ttl_sec=record.ttl_sec,
        now=now.timestamp(),
    )
    log.info(
        "pool token %s minted for pool %s, tenant %s",
        record.id,
        name,
        tenant,
        extra={"pool": name, "tenant": tenant, "actor": principal.subject},
    )
    expires_at = datetime.fromtimestamp(int(now.timestamp()) + record.ttl_sec, UTC)
    return OrjsonResponse(
        {**render_pool_token(record), "token": token, "expiresAt": expires_at},
        status_code=201,
        headers={"Cache-Control": "no-store"},
    )


@router.get(
    "",
    response_model=PoolTokenList,
    responses=responses(401, 403, 404, 503),
    summary="A pool's tokens, newest first, revoked ones included (admin, or the pool's owner)",
)
async def list_pool_tokens(
    name: PoolName,
    state: State,
    principal: Authenticated,
    limit: Annotated[int, Query(ge=1, le=500, description="At most this many.")] = 100,
) -> Response:
    await _managed_pool(state, principal, name)
    tokens = await state.stores.pool_tokens.list_tokens(name, limit)
    return OrjsonResponse({"items": [render_pool_token(t) for t in tokens]})


@router.delete(
    "/{token_id}",
    status_code=204,
    responses=responses(401, 403, 404, 503),
    summary="Revoke a pool token: the worker gateway refuses it within 2 s (admin, or the pool's owner)",
)
async def revoke_pool_token(name: PoolName, token_id: TokenId, state: State, principal: Authenticated) -> Response:
    await _managed_pool(state, principal, name)
    revoked = await state.stores.pool_tokens.revoke_token(token_id, name)
    if revoked is None:
        raise ProblemError(404, f"pool {name} has no token {token_id}")
    log.info("pool token %s revoked", token_id, extra={"pool": name, "actor": principal.subject})
    return Response(status_code=204)
