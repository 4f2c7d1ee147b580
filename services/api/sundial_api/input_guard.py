"""The request's path and query string, checked before routing: text no resource can hold, and empty cursors.

Postgres' text refuses NUL (``CharacterNotInRepertoireError``), so a filter (``?label=a%00b``) or an id
(``/v1/admin/tenants/a%00b``) holding one would fail its statement with a 500. No stored value can contain it:
a path with one names nothing (404, as any unknown id), a query parameter with one is a 422 naming it. Bodies
are checked where they are parsed (:mod:`sundial_api.json_body`). The check is a byte search of the raw path
and query string, done once per request.

An empty ``cursor`` parameter (``?cursor=``, what a client sends for "no next page yet") is the first page, as
an absent one: it is dropped here, so every list operation reads it the same way.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Scope, Send

from sundial_api.problems import field_error, problem_response

_MESSAGE = "cannot contain the NUL character (%00)"


def nul_parameter(query_string: bytes) -> str | None:
    """The first query parameter whose name or value holds a NUL character; None when none does."""
    if b"%00" not in query_string and b"\x00" not in query_string:
        return None
    for name, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        if "\x00" in name or "\x00" in value:
            return name.replace("\x00", "\\u0000")
    return None


def without_empty_cursor(query_string: bytes) -> bytes:
    """``query_string`` less its empty ``cursor`` parameters."""
    if b"cursor=" not in query_string:
        return query_string
    return b"&".join(part for part in query_string.split(b"&") if part != b"cursor=")


class InputGuardMiddleware:
    """404 for a path and 422 for a query parameter holding a NUL; empty cursors dropped (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if "\x00" in scope["path"]:
                path = scope["path"].replace("\x00", "%00")
                await problem_response(404, f"{path} not found")(scope, receive, send)
                return
            name = nul_parameter(scope.get("query_string", b""))
            if name is not None:
                response = problem_response(422, f"`{name}` {_MESSAGE}", [field_error(name, _MESSAGE)])
                await response(scope, receive, send)
                return
            query_string = scope.get("query_string", b"")
            if b"cursor=" in query_string:
                scope = {**scope, "query_string": without_empty_cursor(query_string)}
        await self.app(scope, receive, send)
