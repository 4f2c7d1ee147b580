"""Errors as RFC 9457 problem documents (DESIGN invariant 7: a clear error naming the field).

Every 4xx/5xx the API sends is ``application/problem+json`` with ``type``, ``title``, ``status``,
``detail`` and ``errors: [{"field", "message"}]``, where ``field`` is the dotted camelCase path of the
input at fault (``target.pool``, ``retryPolicy.maxAttempts``, ``cursor``, ``body``). Handlers raise
:class:`ProblemError`; pydantic's validation errors, Starlette's HTTP errors, database outages and a row
deleted under a request's write (a foreign key to a job that job retention removed) are translated here, so no
endpoint formats an error itself.

Problem ``type`` values are ``tag:`` URIs (RFC 9457 §3.1.1 suggests them for types that are identifiers
rather than documentation pages): ``tag:sundial.dev,2026:problem:<slug>``.
"""

from __future__ import annotations

import difflib
import logging
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from http import HTTPStatus
from typing import Any
from uuid import UUID

import asyncpg
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from sundial_api.models.common import Problem
from sundial_api.responses import ProblemResponse

log = logging.getLogger("sundial.api")

PROBLEM_TYPE_BASE = "tag:sundial.dev,2026:problem:"
_SOURCES = frozenset({"body", "query", "path", "header", "cookie"})

_SLUGS = {
    400: "bad-request",
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    409: "conflict",
    413: "content-too-large",
    415: "unsupported-media-type",
    422: "validation-error",
    500: "internal-error",
    503: "unavailable",
}

# Postgres is unreachable or refusing work: the request may succeed if retried, so 503, not 500.
DATABASE_UNAVAILABLE: tuple[type[Exception], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.TooManyConnectionsError,
    # A pooled connection Postgres terminated can fail its next use with this client-side state error.
    asyncpg.InternalClientError,
    OSError,
)

FieldErrors = Sequence[Mapping[str, str]]

# A foreign key's violation, as Postgres details it: ``Key (job_id)=(0193…) is not present in table "jobs".``
_MISSING_KEY = re.compile(
    r'^Key \((?P<column>[^)]*)\)=\((?P<value>[^)]*)\) is not present in table "(?P<table>[^"]+)"\.$'
)
# The referenced tables whose rows go while requests may still name them, and the resource each 404 names. Job
# retention (sundial_sweeper.job_retention) deletes jobs that ended a month ago: a request that read the job (a
# backfill of a COMPLETED job) can insert its row after the delete committed. (A new edge's check locks its
# parents, FOR SHARE, so it finds the job gone instead; a trigger's update matches no row: both 404 already.)
_GONE_UNDER_WRITE = {"jobs": "job"}


class ProblemError(Exception):
    """Raise from a handler to answer with a problem document."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        errors: FieldErrors = (),
        headers: Mapping[str, str] | None = None,
        slug: str | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.errors = list(errors)
        self.headers = dict(headers or {})
        self.slug = slug


class BodyRefused(HTTPException):
    """A request body refused while it is read (:mod:`sundial_api.json_body`): too deep, or holding text Postgres
    cannot store. FastAPI's body reading lets its ``HTTPException`` through (anything else would become its
    generic 400), so this one is answered as raised, with the field named."""

    def __init__(self, status: int, detail: str, errors: FieldErrors = ()) -> None:
        super().__init__(status_code=status, detail=detail)
        self.errors = list(errors)


def field_error(field: str, message: str) -> dict[str, str]:
    return {"field": field, "message": message}


def invalid(field: str, message: str) -> ProblemError:
    """422 naming one field."""
    return ProblemError(422, f"`{field}` {message}", errors=[field_error(field, message)])


def not_found(kind: str, ident: str) -> ProblemError:
    # The same answer for an unknown id, a malformed one and another tenant's: nothing leaks.
    return ProblemError(404, f"{kind} {ident} not found")


def parse_resource_id(kind: str, raw: str) -> UUID:
    """A path id as a UUID; anything that is not one is simply not found (404, never 422)."""
    try:
        return UUID(raw)
    except ValueError:
        raise not_found(kind, raw) from None


def problem_body(status: int, detail: str, errors: FieldErrors = (), slug: str | None = None) -> dict[str, Any]:
    try:
        title = HTTPStatus(status).phrase
    except ValueError:  # a non-standard status
        title = "Error"
    return {
        "type": PROBLEM_TYPE_BASE + (slug or _SLUGS.get(status, str(status))),
        "title": title,
        "status": status,
        "detail": detail,
        "errors": list(errors),
    }


def problem_response(
    status: int,
    detail: str,
    errors: FieldErrors = (),
    headers: Mapping[str, str] | None = None,
    slug: str | None = None,
) -> ProblemResponse:
    return ProblemResponse(problem_body(status, detail, errors, slug), status_code=status, headers=headers)


# --- pydantic locations → field paths --------------------------------------------------------------


def field_path(loc: Sequence[str | int]) -> str:
    """``("body", "target", "pool")`` → ``target.pool``; ``("query", "cursor")`` → ``cursor``.

    Request models use camelCase aliases and pydantic reports locations by alias (see :func:`aliased`
    for the exception), so the path is in the client's spelling. List positions render as ``[i]``. The
    bare source (the whole body) is named ``body``.
    """
    parts = list(loc)
    source = str(parts.pop(0)) if parts and parts[0] in _SOURCES else None
    path = ""
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or source or "body"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):  # `Model | None`
        models = [m for m in map(_model_in, typing.get_args(annotation)) if m is not None]
        return models[0] if len(models) == 1 else None
    return None


def _field_named(model: type[BaseModel], part: str | int) -> tuple[str, type[BaseModel] | None] | None:
    """The field ``part`` names in ``model`` (by alias or by Python name): its alias and its model type."""
    if not isinstance(part, str):
        return None
    for name, info in model.model_fields.items():
        alias = info.alias or name
        if part in (alias, name):
            return alias, _model_in(info.annotation)
    return None


def aliased(model: type[BaseModel], path: Sequence[str | int]) -> tuple[str | int, ...]:
    """``path`` with every field written as the client spells it.

    Pydantic reports a location by alias, except when a validator fails on a *default* value
    (``validate_default``: "runAt is required for ONE_SHOT"), where it uses the Python name.
    """
    out: list[str | int] = []
    current: type[BaseModel] | None = model
    for part in path:
        found = _field_named(current, part) if current is not None else None
        if found is None:
            out.append(part)
            current = None
        else:
            out.append(found[0])
            current = found[1]
    return tuple(out)


def allowed_fields(model: type[BaseModel], path: Sequence[str | int]) -> list[str] | None:
    """The field names (aliases) accepted at ``path`` inside ``model``; None if ``path`` is not an object."""
    current = model
    for part in path:
        fields = {(info.alias or name): info for name, info in current.model_fields.items()}
        info = fields.get(part) if isinstance(part, str) else None
        sub = _model_in(info.annotation) if info is not None else None
        if sub is None:
            return None
        current = sub
    return [info.alias or name for name, info in current.model_fields.items()]


def _normalized(name: str) -> str:
    return name.replace("_", "").replace("-", "").casefold()


def suggest_field(name: str, allowed: Iterable[str]) -> str | None:
    """The allowed field an unknown one most likely meant (``run_at`` → ``runAt``, ``delaySecs`` → …)."""
    by_normal = {_normalized(a): a for a in allowed}
    if (exact := by_normal.get(_normalized(name))) is not None:
        return exact
    close = difflib.get_close_matches(_normalized(name), list(by_normal), n=1, cutoff=0.7)
    return by_normal[close[0]] if close else None


def describe(error: Mapping[str, Any], body_model: type[BaseModel] | None) -> dict[str, str]:
    """One pydantic/FastAPI error as ``{"field", "message"}`` in words a client can act on."""
    kind = error.get("type", "")
    loc: tuple[str | int, ...] = tuple(error.get("loc", ()))
    ctx = error.get("ctx") or {}
    if kind == "json_invalid":
        where = f" at character {loc[-1]}" if loc and isinstance(loc[-1], int) else ""
        return field_error("body", f"malformed JSON: {ctx.get('error', 'cannot be parsed')}{where}")
    if body_model is not None and loc and loc[0] == "body":
        # The last part of an unknown field is the client's own spelling: keep it as sent.
        keep = 1 if kind == "extra_forbidden" else 0
        loc = ("body", *aliased(body_model, loc[1 : len(loc) - keep]), *loc[len(loc) - keep :])
    field = field_path(loc)
    if kind == "extra_forbidden":
        name = str(loc[-1])
        allowed = allowed_fields(body_model, loc[1:-1]) if body_model is not None and loc and loc[0] == "body" else None
        message = "unknown field"
        if allowed is not None:
            hint = suggest_field(name, allowed)
            message += f"; did you mean `{hint}`?" if hint else f"; allowed here: {', '.join(allowed)}"
        return field_error(field, message)
    if kind == "missing":
        return field_error(field, "is required")
    message = str(error.get("msg", "is invalid"))
    return field_error(field, message.removeprefix("Value error, "))


def _body_model(request: Request) -> type[BaseModel] | None:
    # The route's declared body type tells which fields are allowed, for "did you mean" hints. FastAPI
    # keeps it on the route it matched; if that ever changes shape, hints are simply left out.
    body_field = getattr(request.scope.get("route"), "body_field", None)
    field_info = getattr(body_field, "field_info", None)
    return _model_in(getattr(field_info, "annotation", None))


# --- exception handlers --------------------------------------------------------------------------


async def _on_problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProblemError)
    return problem_response(exc.status, exc.detail, exc.errors, exc.headers, exc.slug)


async def _on_validation(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    model = _body_model(request)
    errors = [describe(e, model) for e in exc.errors()]
    fields = ", ".join(dict.fromkeys(f"`{e['field']}`" for e in errors))
    return problem_response(422, f"invalid request: {fields}", errors)


#: What FastAPI answers (400) for a JSON body it cannot decode other than as malformed JSON (not UTF-8, say).
_UNPARSABLE = "There was an error parsing the body"


async def _on_http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
    errors: FieldErrors = getattr(exc, "errors", ())
    if exc.status_code == 400 and detail == _UNPARSABLE:
        message = "cannot be parsed: send JSON encoded as UTF-8"
        detail, errors = f"the request body {message}", [field_error("body", message)]
    return problem_response(exc.status_code, detail, errors, headers=headers)


async def _on_database_unavailable(request: Request, exc: Exception) -> Response:
    log.warning("database unavailable: %r", exc)
    return problem_response(503, "the database is unavailable; retry shortly", headers={"Retry-After": "1"})


async def _on_missing_reference(request: Request, exc: Exception) -> Response:
    """A write naming a row deleted since the request read it: 404 for that resource, as if the request had come
    a moment later (the statement failed, so its transaction wrote nothing). Any other key: a bug, 500."""
    assert isinstance(exc, asyncpg.ForeignKeyViolationError)
    missing = _MISSING_KEY.match(getattr(exc, "detail", None) or "")
    kind = _GONE_UNDER_WRITE.get(missing["table"]) if missing is not None else None
    if missing is None or kind is None:
        return await _on_unexpected(request, exc)
    log.info("%s %s deleted under %s %s", kind, missing["value"], request.method, request.url.path)
    return problem_response(404, not_found(kind, missing["value"]).detail)


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error in %s %s", request.method, request.url.path)
    return problem_response(500, "internal error")


def install(app: FastAPI) -> None:
    """Register the handlers that turn every error into a problem document."""
    app.add_exception_handler(ProblemError, _on_problem)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http)
    for exc_type in DATABASE_UNAVAILABLE:
        app.add_exception_handler(exc_type, _on_database_unavailable)
    app.add_exception_handler(asyncpg.ForeignKeyViolationError, _on_missing_reference)
    app.add_exception_handler(Exception, _on_unexpected)


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for a route's error statuses (the app publishes them as problem+json)."""
    descriptions = {
        400: "The body cannot be parsed: not JSON in UTF-8, or nested deeper than 1,024 levels.",
        401: "Missing or invalid bearer token.",
        404: "No such resource for this tenant.",
        409: "The resource's state does not allow this.",
        410: "Finished and removed from Postgres by retention; `detail` and `Link` point at its history.",
        413: "Request body or `payload` too large.",
        422: "Invalid input; `errors` names each field at fault.",
        503: "A dependency is unavailable; retry.",
    }
    return {
        status: {
            "model": Problem,
            "description": descriptions.get(status, HTTPStatus(status).phrase),
        }
        for status in statuses
    }
