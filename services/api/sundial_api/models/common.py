"""Shapes every part of the API shares: the request and view bases, instants, problem documents, probes.

Requests are camelCase, frozen and refuse unknown fields; views (defined in :mod:`sundial_client.models`) are
camelCase and accept either name.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict
from pydantic.alias_generators import to_camel
from sundial_client.models.common import FieldError, Health, Problem, Readiness, ViewModel

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
