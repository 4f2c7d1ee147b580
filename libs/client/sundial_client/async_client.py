"""``AsyncClient``: every Sundial API operation over asyncio, typed, with safe retries.

The namespaces (``client.jobs``, ``client.executions``, ``client.admin``, …) are written once, over the
:class:`~sundial_client.caller.Caller` this client is; the blocking :class:`~sundial_client.client.Client`
runs the same ones on an event loop of its own. Listings are async iterators that fetch the next page as
they go; ``create_many`` sends ``POST /v1/jobs:batch`` in chunks.

    async with AsyncClient("http://127.0.0.1:8080", token=token) as client:
        job = await client.schedule(handler="echo", pool="demo").after(seconds=30)
        async for job in client.jobs.list(state="ACTIVE"):
            ...
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Self, TypeVar

import httpx

from sundial_client.admin import AsyncAdmin
from sundial_client.bulk import AsyncBulk
from sundial_client.calls import Call
from sundial_client.errors import ConnectionFailed, raise_for_problem
from sundial_client.executions import AsyncExecutions
from sundial_client.jobs import AsyncJobs, AsyncScheduleBuilder, JobDraft, Scheduling
from sundial_client.models import Job
from sundial_client.notifications import AsyncNotifications
from sundial_client.replays import AsyncReplays
from sundial_client.retries import Retries
from sundial_client.tenancy import AsyncBreakers, AsyncPools, AsyncSchedules, AsyncStats

T = TypeVar("T")
DEFAULT_TIMEOUT_SEC = 10.0
USER_AGENT = "sundial-client/0.1"


def default_headers(token: str | None) -> dict[str, str]:
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def request_headers(call: Call[Any]) -> dict[str, str]:
    headers = dict(call.headers)
    if call.idempotent_create:
        # One key per call, the same on every retry of it: the server creates once and replays its answer.
        headers.setdefault("Idempotency-Key", str(uuid.uuid4()))
    return headers


class AsyncClient(Scheduling[Awaitable[Job], AsyncScheduleBuilder]):
    """The Sundial API over asyncio. ``AsyncClient(url, token=...)``; ``await aclose()`` or ``async with``."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_SEC,
        retry: Retries | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.retry = retry or Retries()
        self.wait = sleep
        self.http = httpx.AsyncClient(
            base_url=url, headers=default_headers(token), timeout=timeout, transport=transport
        )
        self.jobs = AsyncJobs(self)
        self.executions = AsyncExecutions(self)
        self.schedules = AsyncSchedules(self)
        self.admin = AsyncAdmin(self)
        self.pools = AsyncPools(self)
        self.replays = AsyncReplays(self)
        self.bulk = AsyncBulk(self)
        self.stats = AsyncStats(self)
        self.breakers = AsyncBreakers(self)
        self.notifications = AsyncNotifications(self)

    async def sleep(self, seconds: float) -> None:
        """How this client waits between polls and retries (``sleep=`` at construction)."""
        await self.wait(seconds)

    async def call(self, call: Call[T]) -> T:
        """Send one operation, retrying what is safe to retry (see :mod:`sundial_client.retries`)."""
        headers = request_headers(call)
        failures = 0
        while True:
            try:
                response = await self.http.request(
                    call.method, call.path, params=call.params, json=call.body, headers=headers
                )
            except (httpx.TransportError, httpx.DecodingError) as exc:
                failures += 1
                if failures >= self.retry.attempts or isinstance(exc, httpx.UnsupportedProtocol):
                    raise ConnectionFailed(f"{call.method} {call.path}: {type(exc).__name__}: {exc}") from exc
                await self.sleep(self.retry.delay(failures))
                continue
            if self.retry.retryable(response) and failures + 1 < self.retry.attempts:
                failures += 1
                await self.sleep(self.retry.delay(failures, response))
                continue
            raise_for_problem(response)
            return call.read(response)

    def builder(self, draft: JobDraft) -> AsyncScheduleBuilder:
        return AsyncScheduleBuilder(self.jobs, draft)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
