"""The base of every response shape, and the shapes every part of the API shares: problem documents, probes.

Views are camelCase on the wire and snake_case in Python (either name is accepted); fields they do not
know are ignored, so an older client reads a newer server's answers.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


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
