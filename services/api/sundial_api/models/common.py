"""Shapes every part of the API shares: the request and view bases, instants, problem documents, probes.

Requests are camelCase, frozen and refuse unknown fields; views are camelCase and accept either name.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

from sundial_api.schedule import parse_instant


class RequestModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", frozen=True)


def _instant(value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError("must be an RFC 3339 date-time string such as 2026-05-05T10:00:00Z")
    return parse_instant(value)


#: An RFC 3339 instant; without an offset it is wall-clock time in the job's ``timezone``.
Instant = Annotated[datetime, BeforeValidator(_instant)]


class ViewModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class FieldError(ViewModel):
    field: str = Field(description="Dotted camelCase path of the offending input, e.g. `target.pool`.")
    message: str


class Problem(ViewModel):
    """An RFC 9457 problem document (`application/problem+json`)."""

    type: str
    title: str
    status: int
    detail: str
    errors: list[FieldError] = Field(default_factory=list)


class Health(ViewModel):
    status: str


class Readiness(ViewModel):
    status: str
    checks: dict[str, str] = Field(description="Per dependency: `ok` or what went wrong.")
