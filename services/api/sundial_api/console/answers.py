"""The console asks the API's own endpoints, so a page shows exactly what ``/v1`` would answer that token.

Each console page calls the ``/v1`` endpoint functions (``jobs.get_job``, ``executions.retry_execution`` …)
with the session's principal: the same stores, the same tenant filter, the same audit rows and the same
problems (a 404 for another tenant's job, a 409 for a finished execution). :func:`answer` turns an
endpoint's JSON response back into data for a template.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import orjson
from starlette.responses import Response


async def answer(call: Awaitable[Response]) -> Any:
    """The decoded JSON body of an endpoint's response (its problems propagate as the endpoint raised them)."""
    response = await call
    return orjson.loads(bytes(response.body))
