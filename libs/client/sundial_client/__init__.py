"""Sundial's Python client: ``Client`` (blocking) and ``AsyncClient``, one implementation, the API's own models.

from sundial_client import Client
with Client("http://127.0.0.1:8080", token=token) as client:
    job = client.schedule(handler="send_welcome", pool="email").after(seconds=30)

Names are imported when first used, so ``sundial --help`` (whose entry point lives in this package) pays for
neither httpx nor pydantic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sundial_client.async_client import AsyncClient
    from sundial_client.client import Client
    from sundial_client.errors import (
        ApiError,
        BadRequest,
        Conflict,
        ConnectionFailed,
        Forbidden,
        NotFound,
        PreconditionFailed,
        RateLimited,
        SundialError,
        Unauthorized,
        Unavailable,
        ValidationFailed,
    )
    from sundial_client.executions import WaitTimedOut
    from sundial_client.models import (
        Execution,
        ExecutionDetail,
        ExecutionState,
        Job,
        JobDetail,
        JobState,
        JobType,
        NewJob,
        RetryPolicy,
        SchedulePreviewRequest,
        Target,
    )
    from sundial_client.retries import Retries

_HOMES = {
    "AsyncClient": "sundial_client.async_client",
    "Client": "sundial_client.client",
    "Retries": "sundial_client.retries",
    "WaitTimedOut": "sundial_client.executions",
    **dict.fromkeys(
        (
            "ApiError",
            "BadRequest",
            "Conflict",
            "ConnectionFailed",
            "Forbidden",
            "NotFound",
            "PreconditionFailed",
            "RateLimited",
            "SundialError",
            "Unauthorized",
            "Unavailable",
            "ValidationFailed",
        ),
        "sundial_client.errors",
    ),
    **dict.fromkeys(
        (
            "Execution",
            "ExecutionDetail",
            "ExecutionState",
            "Job",
            "JobDetail",
            "JobState",
            "JobType",
            "NewJob",
            "RetryPolicy",
            "SchedulePreviewRequest",
            "Target",
        ),
        "sundial_client.models",
    ),
}

__all__ = [
    "ApiError",
    "AsyncClient",
    "BadRequest",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "Execution",
    "ExecutionDetail",
    "ExecutionState",
    "Forbidden",
    "Job",
    "JobDetail",
    "JobState",
    "JobType",
    "NewJob",
    "NotFound",
    "PreconditionFailed",
    "RateLimited",
    "Retries",
    "RetryPolicy",
    "SchedulePreviewRequest",
    "SundialError",
    "Target",
    "Unauthorized",
    "Unavailable",
    "ValidationFailed",
    "WaitTimedOut",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'sundial_client' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
