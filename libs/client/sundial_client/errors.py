"""What the client raises: one exception per kind of API problem, each carrying the problem document.

Every API error is an RFC 9457 problem (``type``, ``title``, ``status``, ``detail``, ``errors`` naming each
field at fault); :func:`raise_for_problem` turns a response into the matching :class:`ApiError` subclass,
so callers catch what they can act on (``except ValidationFailed as e: e.errors``) instead of matching
status codes.
"""

from __future__ import annotations

import httpx
from pydantic import ValidationError

from sundial_client.models import FieldError, Problem


class SundialError(Exception):
    """Anything the client raises."""


class ConnectionFailed(SundialError):
    """The API could not be reached (or kept dropping the connection) after every retry."""


class ApiError(SundialError):
    """The API answered with a problem document."""

    def __init__(self, problem: Problem, response: httpx.Response | None = None) -> None:
        super().__init__(problem.detail)
        self.problem = problem
        self.response = response

    @property
    def status(self) -> int:
        return self.problem.status

    @property
    def detail(self) -> str:
        return self.problem.detail

    @property
    def errors(self) -> list[FieldError]:
        """The fields at fault and what is wrong with each (``target.pool``: "is required")."""
        return self.problem.errors

    def __str__(self) -> str:
        lines = [f"{self.status} {self.problem.title}: {self.detail}"]
        lines += [f"  {e.field}: {e.message}" for e in self.errors]
        return "\n".join(lines)


class BadRequest(ApiError):
    """400, 413, 415 or 422: the input is wrong; ``errors`` says where."""


class ValidationFailed(BadRequest):
    """422: a field is invalid; ``errors`` names each one."""


class Unauthorized(ApiError):
    """401: no token, or an invalid or expired one."""


class Forbidden(ApiError):
    """403: the token may not do this (e.g. an admin endpoint with a tenant token)."""


class NotFound(ApiError):
    """404: no such job or execution for this tenant."""


class Conflict(ApiError):
    """409: the resource's state does not allow this (pausing a cancelled job, cancelling a finished run)."""


class PreconditionFailed(ApiError):
    """412: the job changed since the version sent in ``If-Match``."""


class RateLimited(ApiError):
    """429, after every retry."""


class Unavailable(ApiError):
    """503 (or another 5xx), after every retry where it was retried."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    412: PreconditionFailed,
    413: BadRequest,
    415: BadRequest,
    422: ValidationFailed,
    429: RateLimited,
}


def problem_of(response: httpx.Response) -> Problem:
    """The response's problem document; a synthetic one when the body is not one (a proxy's HTML page)."""
    try:
        return Problem.model_validate_json(response.content)
    except ValidationError:
        text = response.text.strip()[:200] or response.reason_phrase
        return Problem(
            type="about:blank", title=response.reason_phrase or "Error", status=response.status_code, detail=text
        )


def raise_for_problem(response: httpx.Response) -> None:
    """Raise the :class:`ApiError` matching a 4xx/5xx response; return for anything else."""
    if response.status_code < 400:
        return
    problem = problem_of(response)
    status = response.status_code
    kind = _BY_STATUS.get(status) or (Unavailable if status >= 500 else ApiError)
    raise kind(problem, response)
