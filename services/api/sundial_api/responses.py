"""Response classes: every JSON body the API sends is serialized by orjson in one C call.

FastAPI's own ``ORJSONResponse`` is deprecated (it now prefers pydantic serialization of a declared
return type), but the API's hot paths build plain dicts from database rows and skip response-model
validation entirely, which is faster still; this class is the serializer for those dicts. Instants come
out as RFC 3339 in UTC with a ``Z`` suffix.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse

_OPTIONS = orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC | orjson.OPT_NON_STR_KEYS


def dumps(content: Any) -> bytes:
    """Serialize ``content`` exactly as the API's responses do."""
    return orjson.dumps(content, option=_OPTIONS)


class OrjsonResponse(JSONResponse):
    """``application/json`` rendered by orjson (UUIDs, datetimes and dataclasses natively)."""

    def render(self, content: Any) -> bytes:
        return dumps(content)


class ProblemResponse(OrjsonResponse):
    """An RFC 9457 problem document."""

    media_type = "application/problem+json"
