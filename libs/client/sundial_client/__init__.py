"""Sundial's Python client: ``Client`` (blocking) and ``AsyncClient`` over the same typed models.

from sundial_client import Client
with Client("http://127.0.0.1:8080", token=token) as client:
    job = client.schedule(handler="send_welcome", pool="email").after(seconds=30)
"""

from sundial_client.client import AsyncClient, Client
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
]
