"""Signing in and out of the console: a bearer token exchanged for a session cookie, and the dev shortcut.

* ``GET /ui/sign-in`` shows the form; ``POST /ui/sign-in`` takes a bearer token (the same JWT ``/v1`` takes),
  verifies it as the API does (signature, audience, issuer, expiry; a registered, active tenant) and opens a
  session that lasts as long as the token. The token is not kept, and never put in a URL.
* ``POST /ui/sign-in/dev`` opens a session for ``SUNDIAL_CONSOLE_DEV_TENANT`` in one click, only when
  ``SUNDIAL_ENV=dev`` and the browser is on this machine.
* Behind a trusted SSO proxy (:mod:`sundial_api.console.sso`), ``GET /ui/sign-in`` opens a session for the
  identity the proxy names, without a token.
* ``POST /ui/sign-out`` ends the session server-side (a copied cookie stops working too); so do the tenant's
  suspension and the rotation of the key that signed the token (:mod:`sundial_api.console.signing_keys`).

Before any session exists, the sign-in forms carry a token that must match a ``SameSite=Strict`` cookie set
with the form (double submit), so another site cannot sign a browser in as someone else.
"""

from __future__ import annotations

import re
import secrets
import time

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response
from sundial_common.security.auth import TENANT, InvalidToken, Principal

from sundial_api.console.guard import (
    ConsoleRoute,
    Signed,
    cookie_secure,
    from_loopback,
    read_form,
    same_origin,
    tokens_match,
)
from sundial_api.console.render import page
from sundial_api.console.sessions import COOKIE, SIGN_IN_COOKIE, SessionStore
from sundial_api.console.signing_keys import key_of
from sundial_api.console.sso import SSO_SESSION_SEC, UntrustedIdentity, identity_of
from sundial_api.problems import ProblemError
from sundial_api.state import ApiState, State
from sundial_api.tokens import expiry_of

router = APIRouter(prefix="/ui", route_class=ConsoleRoute, include_in_schema=False)

_TENANT = re.compile(TENANT)
#: How long a one-click development session lasts.
DEV_SESSION_SEC = 12 * 3600
#: The longest bearer token the form takes (a JWT with a few claims is well under 2 KiB).
MAX_TOKEN_CHARS = 8192


def dev_sign_in_offered(request: Request, state: ApiState) -> bool:
    return state.settings.env == "dev" and from_loopback(request)


def _sign_in_form(request: Request, state: ApiState, *, status_code: int = 200, error: str | None = None) -> Response:
    form_token = request.cookies.get(SIGN_IN_COOKIE) or secrets.token_urlsafe(32)
    response = page(
        request,
        "sign_in.html",
        {
            "form_token": form_token,
            "dev_offered": dev_sign_in_offered(request, state),
            "dev_tenant": state.settings.console_dev_tenant,
            "error": error,
        },
        status_code=status_code,
    )
    response.set_cookie(
        SIGN_IN_COOKIE, form_token, max_age=3600, path="/ui", httponly=True, samesite="strict",
        secure=cookie_secure(request),
    )  # fmt: skip
    return response


@router.get("/sign-in")
async def sign_in_page(request: Request, state: State) -> Response:
    """The sign-in form; behind a trusted SSO proxy, the proxy's identity signs in at once."""
    try:
        sso = identity_of(request, state.settings)
    except UntrustedIdentity as exc:
        raise ProblemError(403, str(exc)) from None
    if sso is None or request.query_params.get("notice") == "signed-out":  # not straight back in after signing out
        return _sign_in_form(request, state)
    refused = await _registered(state, sso.principal.tenant)
    if refused is not None:
        raise ProblemError(403, refused)
    return await _open(request, state, sso.principal, time.time() + SSO_SESSION_SEC)


async def _checked_form(request: Request) -> dict[str, str]:
    """The sign-in form, refused unless sent by this origin with the token of its own cookie."""
    form = await read_form(request)
    expected = request.cookies.get(SIGN_IN_COOKIE)
    if not same_origin(request) or expected is None or not tokens_match(form.get("csrf"), expected):
        raise ProblemError(403, "the sign-in form expired or came from another site: reload it and try again")
    return form


async def _open(
    request: Request, state: ApiState, principal: Principal, expires_at: float, signing_key: str | None = None
) -> Response:
    now = time.time()
    session_id, _ = await SessionStore(state.hot_window.redis).open(principal, expires_at, now, signing_key)
    response = RedirectResponse("/ui/jobs", status_code=303)
    response.set_cookie(
        COOKIE, session_id, max_age=max(1, int(expires_at - now)), path="/ui", httponly=True, samesite="strict",
        secure=cookie_secure(request),
    )  # fmt: skip
    response.delete_cookie(SIGN_IN_COOKIE, path="/ui")
    return response


async def _registered(state: ApiState, tenant: str) -> str | None:
    """Why ``tenant`` may not sign in (unregistered or suspended), or None."""
    entry = await state.tenant_cache.get(tenant)
    if entry is None:
        return f"tenant {tenant} is not registered"
    if not entry.active:
        return f"tenant {tenant} is suspended"
    return None


@router.post("/sign-in")
async def sign_in(request: Request, state: State) -> Response:
    form = await _checked_form(request)
    token = form.get("token", "").strip().removeprefix("Bearer ").strip()
    if not token or len(token) > MAX_TOKEN_CHARS:
        return _sign_in_form(request, state, status_code=400, error="paste a bearer token")
    try:
        principal = await state.verifier.verify(token)
    except InvalidToken as exc:
        return _sign_in_form(request, state, status_code=401, error=f"invalid bearer token: {exc}")
    if not _TENANT.match(principal.tenant):
        return _sign_in_form(request, state, status_code=401, error="invalid bearer token: malformed tenant name")
    refused = await _registered(state, principal.tenant)
    if refused is not None:
        return _sign_in_form(request, state, status_code=403, error=refused)
    return await _open(request, state, principal, expiry_of(token), key_of(token, state.verifier))


@router.post("/sign-in/dev")
async def dev_sign_in(request: Request, state: State) -> Response:
    await _checked_form(request)
    if not dev_sign_in_offered(request, state):
        raise ProblemError(403, "one-click sign-in is only for SUNDIAL_ENV=dev, from this machine")
    tenant = state.settings.console_dev_tenant
    refused = await _registered(state, tenant)
    if refused is not None:
        return _sign_in_form(request, state, status_code=403, error=refused)
    principal = Principal(tenant=tenant, subject="console-dev")
    return await _open(request, state, principal, time.time() + DEV_SESSION_SEC)


@router.post("/sign-out")
async def sign_out(request: Request, state: State, session: Signed) -> Response:
    await SessionStore(state.hot_window.redis).end(request.cookies.get(COOKIE, ""))
    response = RedirectResponse("/ui/sign-in?notice=signed-out", status_code=303)
    response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict", secure=cookie_secure(request))
    return response


@router.get("")
@router.get("/")
async def home(session: Signed) -> Response:
    return RedirectResponse("/ui/jobs", status_code=303)
