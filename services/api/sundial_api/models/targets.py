"""HTTP targets: the target an HTTP pool's owner sets, and the completion a target sends after a ``202``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictStr
from sundial_common.delivery.signing import redact
from sundial_common.stores.pool_targets import PoolTarget

from sundial_api.models.common import RequestModel

MAX_PATHS = 200
MAX_ERROR_CHARS = 8192


class TargetPut(RequestModel):
    """Where the pool's executions are POSTed."""

    url: Annotated[StrictStr, Field(min_length=1, max_length=2048)] = Field(
        description="The base URL: `https://` (plain `http://` only in development), on an address Sundial may reach.",
        examples=["https://jobs.example.com/sundial"],
    )
    paths: dict[StrictStr, StrictStr] | None = Field(
        None,
        max_length=MAX_PATHS,
        description="Handler name → path under `url` for that handler's executions (a handler not listed is POSTed "
        "to `url` itself).",
        examples=[{"send_welcome": "welcome"}],
    )
    rotate_secret: StrictBool = Field(
        False, description="Make a new signing secret (answered once) instead of keeping the current one."
    )


class Completion(RequestModel):
    """How an attempt the target accepted (`202`) ended."""

    outcome: Literal["succeeded", "failed"] = Field(description="`succeeded`, or `failed`.")
    result: Any = Field(None, description="The execution's result (JSON), for `succeeded`.")
    error: Annotated[StrictStr, Field(max_length=MAX_ERROR_CHARS)] | None = Field(
        None, description="What went wrong, for `failed`."
    )
    retry: StrictBool = Field(
        True, description="For `failed`: whether the job's retry policy may try again (false: DEAD now)."
    )


def render_target(target: PoolTarget, secret: str, *, new: bool) -> dict[str, object]:
    """The target as answered: ``secret`` in full when it was just made (``new``), else redacted."""
    return {
        "pool": target.pool,
        "url": target.url,
        "paths": target.paths,
        "secret": secret if new else redact(secret),
        "updatedBy": target.updated_by,
        "createdAt": target.created_at,
        "updatedAt": target.updated_at,
    }
