"""Request bodies as JSON: parsed by orjson, and refused with a 4xx when Postgres or Python could not take them.

FastAPI reads a JSON body with Starlette's ``Request.json()``, i.e. the standard library's ``json.loads``:
about 3% of the API's CPU per batched job. orjson parses the same text to the same Python values several
times faster. It is stricter (no ``NaN`` or ``1e400``, no lone surrogates, a UTF-8 BOM or UTF-16): a body it
refuses is parsed again by ``json.loads``, so every body is accepted, or refused with the same error, exactly as
before. orjson also reads an integer beyond 64 bits as a float, where ``json.loads`` keeps it exact: a body with
a run of 20 digits or more anywhere goes to ``json.loads`` directly.

Valid JSON that cannot be stored or handled is refused here, before any handler (or the tenant's token) is
looked at, so no such body reaches a 500:

- nested deeper than :data:`MAX_DEPTH` levels: 400 (orjson's limit is 1,024; ``json.loads`` would recurse
  until Python's own limit and raise ``RecursionError``);
- a string holding a lone surrogate (``"\\ud800"``, which only ``json.loads`` accepts) or the NUL character
  (``"\\u0000"``; Postgres' text and jsonb refuse it): 422 naming the field that holds it.

The checks cost nothing on the common path: the surrogate walk runs only for a body orjson refused, the NUL walk
only for a body whose text has the escape.

:class:`JsonRoute` is the route class every router with a JSON body uses, so that every body is read this way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from sundial_api.problems import BodyRefused, field_error, field_path

#: Nesting accepted in a request body (orjson's own limit).
MAX_DEPTH = 1024

_LONG_NUMBER = re.compile(rb"[0-9]{20}")
# An escaped NUL in JSON text: ``\u0000`` after an even number of backslashes, none included (after an odd
# run it is the literal text "\u0000", which is fine).
NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def _too_deep() -> BodyRefused:
    message = f"is nested deeper than {MAX_DEPTH} levels"
    return BodyRefused(400, f"the request body {message}", [field_error("body", message)])


def loads(body: bytes) -> Any:
    """``json.loads(body)``, by orjson where that gives the same values; :class:`BodyRefused` for a body nested
    too deep or holding a string Postgres cannot store."""
    fallback = bool(_LONG_NUMBER.search(body))
    value: Any = None
    if not fallback:
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            if str(exc).startswith("depth limit"):
                raise _too_deep() from None
            fallback = True  # json.loads accepts or refuses it as before
    if fallback:
        try:
            value = json.loads(body)
        except RecursionError:
            raise _too_deep() from None
        refuse_strings(value, _has_surrogate, "cannot contain a lone surrogate (\\ud800-\\udfff)")
    if b"\\u0000" in body and NUL_ESCAPE.search(body):
        refuse_strings(value, _has_nul, "cannot contain the NUL character (\\u0000)")
    return value


def _has_surrogate(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def _has_nul(text: str) -> bool:
    return "\x00" in text


def refuse_strings(value: Any, bad: Callable[[str], bool], message: str) -> None:
    """422 naming the first field of ``value`` whose text (or one of whose keys) ``bad`` refuses; nothing when
    none does. A job's ``payload`` is opaque to the API: the field named is ``payload`` itself."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), value)]
    found: tuple[str | int, ...] | None = None
    while stack and found is None:
        path, item = stack.pop()
        if isinstance(item, str):
            if bad(item):
                found = path
        elif isinstance(item, dict):
            for key, child in item.items():
                if bad(key):  # the key itself is not repeated: it may not even be encodable
                    found, message = path, f"has a key that {message}"
                    break
                stack.append(((*path, key), child))
        elif isinstance(item, list):
            stack.extend(((*path, i), child) for i, child in enumerate(item))
    if found is None:
        return
    if "payload" in found:
        found = found[: found.index("payload") + 1]
    field = field_path(("body", *found))
    raise BodyRefused(422, f"`{field}` {message}", [field_error(field, message)])


class OrjsonRequest(Request):
    """A request whose ``json()`` is :func:`loads` (what FastAPI's handler calls to read a JSON body)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads(await self.body())
        return self._json


class JsonRoute(APIRoute):
    """A route whose JSON body is read by :func:`loads` (its limits and refusals included)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        generic = super().get_route_handler()

        async def route_handler(request: Request) -> Response:
            return await generic(OrjsonRequest(request.scope, request.receive))

        return route_handler
