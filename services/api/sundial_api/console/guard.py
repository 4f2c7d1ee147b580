"""What stands between a browser and the console's pages: the session, CSRF, and the response headers.

* :func:`current_session` (the ``Signed`` dependency) finds the request's session by its cookie, ends it if
  its tenant is no longer registered and active or the API no longer trusts the key that signed its token,
  and, for a state-changing request, checks that it came from this origin and carries the session's CSRF
  token. No session: the browser is sent to sign in.
* :class:`ConsoleRoute` is the route class of every console page: it answers errors as HTML pages (a
  problem of the API's own endpoints keeps its status, e.g. 404 for another tenant's job), never a 500 for
  bad input, and sets the headers every console response carries — a Content-Security-Policy with no inline
  script or style and ``frame-ancestors 'none'``, ``Cache-Control: no-store`` (pages hold tenant data),
  ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: same-origin``.

The session cookie is ``HttpOnly``, ``SameSite=Strict``, ``Path=/ui`` and ``Secure`` unless the browser is on
this machine over plain HTTP (loopback), so it never authenticates ``/v1``, whose routes read only a bearer token.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Annotated, Any
from urllib.parse import parse_qsl, quote, urlsplit

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException
from starlette.responses import RedirectResponse, Response

from sundial_api.console.live import Unchanged
from sundial_api.console.render import is_htmx, page
from sundial_api.console.sessions import COOKIE, ConsoleSession, SessionStore
from sundial_api.console.signing_keys import still_trusted
from sundial_api.console.sso import is_sso_subject, same_user
from sundial_api.problems import DATABASE_UNAVAILABLE, ProblemError, field_error
from sundial_api.state import State

log = logging.getLogger("sundial.api.console")

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # same-origin, not no-referrer: under no-referrer the browser sends `Origin: null` with the forms, which
    # the origin check must refuse; other sites (a trace link) still get no referrer.
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}
_READS = frozenset({"GET", "HEAD"})
#: Largest form the console reads (its forms are small; a job's payload is the largest field).
MAX_FORM_BYTES = 512 * 1024


class SignInRequired(Exception):
    """No live session: the browser goes to the sign-in page (``notice`` says why, from a fixed vocabulary)."""

    def __init__(self, notice: str | None = None) -> None:
        super().__init__(notice or "sign in")
        self.notice = notice


def from_loopback(request: Request) -> bool:
    """The browser is on this machine (the connection's peer is a loopback address)."""
    host = request.client.host if request.client is not None else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cookie_secure(request: Request) -> bool:
    """``Secure`` on the session cookie everywhere but plain HTTP on loopback (a developer's own machine)."""
    return request.url.scheme == "https" or not from_loopback(request)


def same_origin(request: Request) -> bool:
    """The request was sent by a page of this origin (Fetch Metadata and ``Origin``, when the browser sends them)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    return origin is None or urlsplit(origin).netloc == request.headers.get("host", "")


async def read_form(request: Request) -> dict[str, str]:
    """The request's urlencoded form (parsed once, kept on the request); 413 past :data:`MAX_FORM_BYTES`."""
    cached: dict[str, str] | None = getattr(request.state, "console_form", None)
    if cached is not None:
        return cached
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise ProblemError(413, f"the form is larger than {MAX_FORM_BYTES} bytes")
    if body and request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        raise ProblemError(415, "console forms are sent as application/x-www-form-urlencoded")
    try:
        form = dict(parse_qsl(body.decode(), keep_blank_values=True, max_num_fields=100))
    except (UnicodeDecodeError, ValueError):
        raise ProblemError(400, "the form is not valid urlencoded UTF-8") from None
    # Postgres' text cannot hold NUL: refused here, naming the field, rather than failing a statement later.
    for name, value in form.items():
        if "\x00" in name or "\x00" in value:
            raise ProblemError(
                422, "invalid form", errors=[field_error(name.replace("\x00", ""), "cannot contain NUL")]
            )
    request.state.console_form = form
    return form


def tokens_match(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


async def check_csrf(request: Request, expected: str) -> None:
    """A state-changing request must come from this origin and carry ``expected`` (form field or header)."""
    if not same_origin(request):
        raise ProblemError(403, "cross-site request refused")
    given = request.headers.get("x-csrf-token")
    if given is None:
        given = (await read_form(request)).get("csrf")
    if not tokens_match(given, expected):
        raise ProblemError(403, "missing or wrong CSRF token: reload the page and try again")


async def current_session(request: Request, state: State) -> ConsoleSession:
    session_id = request.cookies.get(COOKIE)
    if not session_id:
        raise SignInRequired()
    store = SessionStore(state.hot_window.redis)
    session = await store.get(session_id, time.time())
    if session is None:
        raise SignInRequired("session-ended")
    if is_sso_subject(session.subject) and not same_user(request, state.settings, session.subject):
        await store.end(session_id)  # someone else signed in at the SSO proxy: this browser is theirs now
        raise SignInRequired("session-ended")
    tenant = await state.tenant_cache.get(session.tenant)
    if tenant is None or not tenant.active or not await still_trusted(session.signing_key, state.verifier):
        await store.end(session_id)  # suspension, removal or the key's rotation ends every session it covers
        raise SignInRequired("session-ended")
    if request.method not in _READS:
        await check_csrf(request, session.csrf)
    request.state.console_session = session
    return session


Signed = Annotated[ConsoleSession, Depends(current_session)]


def _sign_in_redirect(request: Request, notice: str | None) -> Response:
    target = "/ui/sign-in"
    if notice:
        target += f"?notice={quote(notice)}"
    if is_htmx(request):  # a live region's refresh: send the whole tab, not a fragment
        return Response(status_code=204, headers={"HX-Redirect": target})
    return RedirectResponse(target, status_code=303)


def error_page(request: Request, status: int, detail: str, errors: Sequence[Mapping[str, str]] = ()) -> Response:
    return page(request, "error.html", {"status": status, "detail": detail, "errors": list(errors)}, status_code=status)


def _validation_errors(exc: RequestValidationError) -> list[dict[str, str]]:
    return [
        {
            "field": ".".join(str(p) for p in err.get("loc", ()) if p not in ("query", "path", "body")),
            "message": err["msg"],
        }
        for err in exc.errors()
    ]


class ConsoleRoute(APIRoute):
    """A console page: HTML errors, sign-in redirects and the console's security headers on every answer."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        generic = super().get_route_handler()

        async def route_handler(request: Request) -> Response:
            response: Response
            try:
                response = await generic(request)
            except Unchanged:
                response = Response(status_code=204)
            except SignInRequired as exc:
                response = _sign_in_redirect(request, exc.notice)
            except ProblemError as exc:
                response = error_page(request, exc.status, exc.detail, exc.errors)
            except RequestValidationError as exc:
                response = error_page(request, 422, "invalid input", _validation_errors(exc))
            except HTTPException as exc:
                response = error_page(request, exc.status_code, str(exc.detail))
            except RedisError as exc:
                log.warning("console: the session store is unavailable: %r", exc)
                response = error_page(request, 503, "the console's session store (Redis) is unavailable; try again")
            except DATABASE_UNAVAILABLE as exc:
                log.warning("console: database unavailable: %r", exc)
                response = error_page(request, 503, "the database is unavailable; try again shortly")
            response.headers.update(SECURITY_HEADERS)
            return response

        return route_handler
