"""Bearer-token authentication: every /v1 route runs as the tenant the token names.

Tokens are JWTs: HS256 minted by ``sundial token`` or RS256/ES256 from an identity provider's JWKS, each checked
for its key id, audience, issuer and expiry (``sundial_common.security.auth``). Anything wrong with the
token — missing, another scheme, bad signature, expired, no tenant — is the same 401, with
``WWW-Authenticate: Bearer`` as RFC 6750 asks, and says what was wrong without echoing the token.

A valid token is accepted only for a tenant in the registry (:mod:`sundial_api.tenant_cache`): an
unregistered one is 401, a SUSPENDED one may read but any write is 403 ``tenant-suspended``. The
``/v1/admin`` routes need an admin token and no registered tenant: that is how the first tenant gets registered.
"""

from __future__ import annotations

import re
import time
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sundial_common.security.auth import TENANT, InvalidToken, MalformedToken, Principal

from sundial_api.problems import ProblemError
from sundial_api.state import ApiState, State

_TENANT = re.compile(TENANT)

# auto_error=False: a missing header must produce our problem document, not FastAPI's default body.
_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="bearerAuth",
    bearerFormat="JWT",
    description="A JWT naming the tenant (`sundial token --tenant <name>` mints one).",
)


def _unauthorized(detail: str, error: str) -> ProblemError:
    return ProblemError(401, detail, headers={"WWW-Authenticate": f'Bearer realm="sundial", error="{error}"'})


_READS = frozenset({"GET", "HEAD", "OPTIONS"})


async def authenticate(
    request: Request, state: State, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    if credentials is None:
        raise ProblemError(
            401,
            "a bearer token is required (Authorization: Bearer <jwt>)",
            headers={"WWW-Authenticate": 'Bearer realm="sundial"'},
        )
    token = credentials.credentials
    principal = state.verified_tokens.get(token, time.time())
    if principal is None:
        try:
            principal = await state.verifier.verify(token)
        except MalformedToken as exc:
            raise _unauthorized(str(exc), "invalid_token") from None
        except InvalidToken as exc:
            raise _unauthorized(f"invalid bearer token: {exc}", "invalid_token") from None
        if not _TENANT.match(principal.tenant):
            raise _unauthorized("invalid bearer token: malformed tenant name", "invalid_token")
        state.verified_tokens.put(token, principal)
    # Operators' routes check the admin claim themselves. The scope's path, not ``request.url``: building the URL
    # object was 3% of a create's CPU (py-spy), for the same path.
    if request.scope["path"].startswith("/v1/admin"):
        return principal
    tenant = await state.tenant_cache.get(principal.tenant)
    if tenant is None:
        raise _unauthorized(
            f"tenant {principal.tenant} is not registered (an operator registers it: "
            f"`sundial tenants create {principal.tenant}`)",
            "invalid_token",
        )
    if not tenant.active and request.method not in _READS:
        raise ProblemError(
            403, f"tenant {principal.tenant} is suspended: it can read but not change anything", slug="tenant-suspended"
        )
    return principal


async def principal_of(request: Request, state: ApiState) -> Principal:
    """What the ``Authenticated`` dependency gives, for a route that calls its endpoint itself
    (:mod:`sundial_api.create_route`)."""
    return await authenticate(request, state, await _bearer(request))


Authenticated = Annotated[Principal, Depends(authenticate)]
