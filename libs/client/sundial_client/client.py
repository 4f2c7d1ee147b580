"""``Client`` and ``AsyncClient``: every Sundial API operation, typed, with safe retries.

Both send the same :mod:`~sundial_client.calls` and read the same models; they differ only in how they
wait (``time.sleep`` / ``asyncio.sleep``, ``httpx.Client`` / ``httpx.AsyncClient``). Listings are
iterators that fetch the next page as they go; ``create_many`` sends ``POST /v1/jobs:batch`` in chunks.

    with Client("http://127.0.0.1:8080", token=token) as client:
        job = client.schedule(handler="echo", pool="demo").after(seconds=30)
        for job in client.jobs.list(state="ACTIVE"):
            ...
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Self, TypeVar, overload

import httpx

from sundial_client import calls
from sundial_client.calls import MAX_BATCH, MAX_PAGE, Call
from sundial_client.errors import ConnectionFailed, raise_for_problem
from sundial_client.models import (
    AuditEntry,
    AuditPage,
    Backfill,
    BackfillDryRun,
    BackfillRequest,
    BatchItem,
    Breaker,
    ClusterView,
    Execution,
    ExecutionDetail,
    ExecutionState,
    ExecutionStats,
    HandlerRanking,
    Job,
    JobDetail,
    JobState,
    JobType,
    NewJob,
    Pool,
    PoolList,
    Preview,
    SchedulePreviewRequest,
    Target,
    Tenant,
    Triggered,
)
from sundial_client.replays import Replays
from sundial_client.retries import Retries

T = TypeVar("T")
DEFAULT_TIMEOUT_SEC = 10.0
USER_AGENT = "sundial-client/0.1"


def _headers(token: str | None) -> dict[str, str]:
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _request_headers(call: Call[Any]) -> dict[str, str]:
    headers = dict(call.headers)
    if call.idempotent_create:
        # One key per call, the same on every retry of it: the server creates once and replays its answer.
        headers.setdefault("Idempotency-Key", str(uuid.uuid4()))
    return headers


def _chunks(items: Iterable[NewJob | Mapping[str, Any]], size: int) -> Iterator[list[Any]]:
    if not 1 <= size <= MAX_BATCH:
        raise ValueError(f"chunk_size must be 1 to {MAX_BATCH}, not {size}")
    chunk: list[Any] = []
    for item in items:
        chunk.append(calls.wire(item))
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _check_page_size(page_size: int) -> int:
    if not 1 <= page_size <= MAX_PAGE:
        raise ValueError(f"page_size must be 1 to {MAX_PAGE}, not {page_size}")
    return page_size


def _audit(client: Client, kind: str, ident: str, actions: Sequence[str], page_size: int) -> Iterator[AuditEntry]:
    cursor: str | None = None
    while True:
        page = client.call(calls.audit(kind, ident, actions=actions, cursor=cursor, limit=_check_page_size(page_size)))
        yield from page.items
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


async def _audit_async(
    client: AsyncClient, kind: str, ident: str, actions: Sequence[str], page_size: int
) -> AsyncIterator[AuditEntry]:
    cursor: str | None = None
    while True:
        page = await client.call(
            calls.audit(kind, ident, actions=actions, cursor=cursor, limit=_check_page_size(page_size))
        )
        for entry in page.items:
            yield entry
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


@dataclass(frozen=True)
class JobDraft:
    """A job's where and what, waiting for its when (``client.schedule(...)`` then ``.at``/``.after``/…)."""

    handler: str
    pool: str
    name: str | None = None
    payload: Mapping[str, Any] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def job(self, type: JobType, **when: Any) -> NewJob:
        return NewJob.model_validate(
            {
                "name": self.name or self.handler,
                "type": type,
                "target": Target(pool=self.pool, handler=self.handler),
                "payload": dict(self.payload) if self.payload is not None else None,
                **self.options,
                **when,
            }
        )

    def at(self, when: datetime) -> NewJob:
        return self.job(JobType.ONE_SHOT, run_at=when)

    def after(self, seconds: float) -> NewJob:
        return self.job(JobType.DELAYED, delay_seconds=math.ceil(seconds))

    def cron(self, expression: str, tz: str = "UTC", **bounds: Any) -> NewJob:
        return self.job(JobType.CRON, schedule=expression, timezone=tz, **bounds)

    def every(self, seconds: int, **bounds: Any) -> NewJob:
        return self.job(JobType.INTERVAL, interval_sec=seconds, **bounds)

    def on(self, instants: Iterable[datetime], **bounds: Any) -> NewJob:
        return self.job(JobType.RUN_LIST, run_list=list(instants), **bounds)


# --- synchronous ----------------------------------------------------------------------------------


class Client:
    """The Sundial API over blocking HTTP. ``Client(url, token=...)``; close it, or use it in ``with``."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_SEC,
        retry: Retries | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.retry = retry or Retries()
        self.sleep = sleep
        self._http = httpx.Client(base_url=url, headers=_headers(token), timeout=timeout, transport=transport)
        self.jobs = Jobs(self)
        self.executions = Executions(self)
        self.schedules = Schedules(self)
        self.admin = Admin(self)
        self.pools = Pools(self)
        self.replays = Replays(self)
        self.stats = Stats(self)
        self.breakers = Breakers(self)

    def call(self, call: Call[T]) -> T:
        """Send one operation, retrying what is safe to retry (see :mod:`sundial_client.retries`)."""
        headers = _request_headers(call)
        failures = 0
        while True:
            try:
                response = self._http.request(
                    call.method, call.path, params=call.params, json=call.body, headers=headers
                )
            except (httpx.TransportError, httpx.DecodingError) as exc:
                failures += 1
                if failures >= self.retry.attempts or isinstance(exc, httpx.UnsupportedProtocol):
                    raise ConnectionFailed(f"{call.method} {call.path}: {type(exc).__name__}: {exc}") from exc
                self.sleep(self.retry.delay(failures))
                continue
            if self.retry.retryable(response) and failures + 1 < self.retry.attempts:
                failures += 1
                self.sleep(self.retry.delay(failures, response))
                continue
            raise_for_problem(response)
            return call.read(response)

    @overload
    def schedule(
        self,
        *,
        handler: str,
        pool: str,
        at: datetime,
        name: str | None = ...,
        payload: Mapping[str, Any] | None = ...,
        **options: Any,
    ) -> Job: ...

    @overload
    def schedule(
        self,
        *,
        handler: str,
        pool: str,
        at: None = ...,
        name: str | None = ...,
        payload: Mapping[str, Any] | None = ...,
        **options: Any,
    ) -> ScheduleBuilder: ...

    def schedule(
        self,
        *,
        handler: str,
        pool: str,
        at: datetime | None = None,
        name: str | None = None,
        payload: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Job | ScheduleBuilder:
        """Register a job for ``handler`` in ``pool``: at once when ``at`` is given, else say when next
        (``.after(seconds=30)``, ``.cron("0 3 * * *", tz=...)``, ``.every(60)``, ``.at(dt)``, ``.on([...])``).
        ``options`` are any other job fields (``retry_policy=``, ``timeout_sec=``, ``jitter_sec=``, …)."""
        builder = ScheduleBuilder(self.jobs, JobDraft(handler, pool, name, payload, options))
        return builder.at(at) if at is not None else builder

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ScheduleBuilder:
    def __init__(self, jobs: Jobs, draft: JobDraft) -> None:
        self._jobs = jobs
        self.draft = draft

    def at(self, when: datetime) -> Job:
        return self._jobs.create(self.draft.at(when))

    def after(self, seconds: float) -> Job:
        return self._jobs.create(self.draft.after(seconds))

    def cron(self, expression: str, tz: str = "UTC", **bounds: Any) -> Job:
        return self._jobs.create(self.draft.cron(expression, tz, **bounds))

    def every(self, seconds: int, **bounds: Any) -> Job:
        return self._jobs.create(self.draft.every(seconds, **bounds))

    def on(self, instants: Iterable[datetime], **bounds: Any) -> Job:
        return self._jobs.create(self.draft.on(instants, **bounds))


class Jobs:
    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, job: NewJob | Mapping[str, Any]) -> Job:
        """``POST /v1/jobs`` with an ``Idempotency-Key`` of its own: retried safely, created once."""
        return self._c.call(calls.create_job(job))

    def create_many(
        self, jobs: Iterable[NewJob | Mapping[str, Any]], *, chunk_size: int = MAX_BATCH
    ) -> list[BatchItem]:
        """``POST /v1/jobs:batch`` per ``chunk_size`` jobs (each chunk idempotent on retry); one result per job,
        ``index`` counting from the first job given. Invalid items come back with their ``problem``."""
        results: list[BatchItem] = []
        for chunk in _chunks(jobs, chunk_size):
            offset = len(results)
            answer = self._c.call(calls.create_jobs(chunk))
            results += [item.model_copy(update={"index": offset + item.index}) for item in answer.results]
        return results

    def get(self, job_id: str) -> JobDetail:
        return self._c.call(calls.get_job(job_id))

    def update(self, job_id: str, *, if_match: int | None = None, **fields: Any) -> Job:
        """``PATCH``: the fields given change (snake_case names; None clears one); ``if_match`` a version."""
        return self._c.call(calls.update_job(job_id, fields, if_match))

    def delete(self, job_id: str, *, cascade: bool = False) -> Job:
        """Cancel the job; a job DEPENDENT jobs wait on is refused (409) unless ``cascade`` cancels them too."""
        return self._c.call(calls.delete_job(job_id, cascade))

    def backfill(self, job_id: str, start: datetime, end: datetime, **options: Any) -> Backfill:
        """``POST /v1/jobs/{id}:backfill``: run the occurrences of ``[start, end)`` that have no execution
        (``overlap_policy``, ``rate_per_sec``); follow it with :meth:`get_backfill`."""
        return self._c.call(calls.backfill_job(job_id, BackfillRequest(range_from=start, range_to=end, **options)))

    def backfill_dry_run(self, job_id: str, start: datetime, end: datetime) -> BackfillDryRun:
        """How many occurrences of ``[start, end)`` a backfill would run, and the first ones; nothing created."""
        return self._c.call(calls.backfill_dry_run(job_id, BackfillRequest(range_from=start, range_to=end)))

    def get_backfill(self, backfill_id: str) -> Backfill:
        return self._c.call(calls.get_backfill(backfill_id))

    def cancel_backfill(self, backfill_id: str) -> Backfill:
        return self._c.call(calls.cancel_backfill(backfill_id))

    def pause(self, job_id: str) -> Job:
        return self._c.call(calls.pause_job(job_id))

    def resume(self, job_id: str) -> Job:
        return self._c.call(calls.resume_job(job_id))

    def trigger(self, job_id: str) -> Triggered:
        return self._c.call(calls.trigger_job(job_id))

    def preview(self, job_id: str, count: int = 10) -> Preview:
        return self._c.call(calls.preview_job(job_id, count))

    def list(
        self,
        *,
        state: JobState | str | None = None,
        type: JobType | str | None = None,
        pool: str | None = None,
        handler: str | None = None,
        name_prefix: str | None = None,
        page_size: int = 50,
    ) -> Iterator[Job]:
        """The tenant's jobs, newest first, fetched a page at a time as the iterator advances."""
        cursor: str | None = None
        while True:
            page = self._c.call(
                calls.list_jobs(
                    state=state,
                    type=type,
                    pool=pool,
                    handler=handler,
                    name_prefix=name_prefix,
                    cursor=cursor,
                    limit=_check_page_size(page_size),
                )
            )
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def executions(self, job_id: str, *, page_size: int = 50) -> Iterator[Execution]:
        """A job's executions, newest occurrence first."""
        cursor: str | None = None
        while True:
            page = self._c.call(calls.job_executions(job_id, cursor=cursor, limit=_check_page_size(page_size)))
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def audit(self, job_id: str, *, actions: Sequence[str] = (), page_size: int = 100) -> Iterator[AuditEntry]:
        """The job's audit trail, oldest first: every change, who made it (token subject), before and after.

        ``actions=["cancel"]`` answers "who cancelled this job?".
        """
        return _audit(self._c, "jobs", job_id, actions, page_size)


class Executions:
    def __init__(self, client: Client) -> None:
        self._c = client

    def audit(self, execution_id: str, *, actions: Sequence[str] = (), page_size: int = 100) -> Iterator[AuditEntry]:
        """The execution's audit trail, oldest first: dispatch, each attempt's start and end, retries, cancels."""
        return _audit(self._c, "executions", execution_id, actions, page_size)

    def get(self, execution_id: str) -> ExecutionDetail:
        return self._c.call(calls.get_execution(execution_id))

    def cancel(self, execution_id: str) -> Execution:
        """CANCELLED at once if it had not started; a RUNNING one is asked to stop (``cancel_requested_at``)."""
        return self._c.call(calls.cancel_execution(execution_id))

    def retry(self, execution_id: str) -> Execution:
        """One more attempt for a DEAD execution."""
        return self._c.call(calls.retry_execution(execution_id))

    def list(
        self,
        state: ExecutionState | str | None = None,
        *,
        pool: str | None = None,
        handler: str | None = None,
        page_size: int = 50,
    ) -> Iterator[Execution]:
        """The tenant's executions, newest first; only those in ``state`` (``DEAD``: the dead letters), ``pool``,
        ``handler`` if given."""
        cursor: str | None = None
        while True:
            call = calls.list_executions(
                state, cursor=cursor, limit=_check_page_size(page_size), pool=pool, handler=handler
            )
            page = self._c.call(call)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def watch(self, execution_id: str, *, poll_sec: float = 1.0) -> Iterator[ExecutionDetail]:
        """The execution now, then each time it changes (state, attempt, worker), until it has ended."""
        last: tuple[Any, ...] | None = None
        while True:
            current = self.get(execution_id)
            seen = (current.state, current.attempt, current.worker_id, current.next_attempt_at, len(current.attempts))
            if seen != last:
                last = seen
                yield current
            if current.ended:
                return
            self._c.sleep(poll_sec)

    def wait(self, execution_id: str, *, poll_sec: float = 1.0) -> ExecutionDetail:
        """Block until the execution has ended; its final view."""
        final: ExecutionDetail | None = None
        for final in self.watch(execution_id, poll_sec=poll_sec):  # noqa: B007 - the last one is the answer
            pass
        assert final is not None
        return final


class Schedules:
    def __init__(self, client: Client) -> None:
        self._c = client

    def preview(self, request: SchedulePreviewRequest | Mapping[str, Any]) -> Preview:
        """The next fires of a schedule, without creating anything."""
        return self._c.call(calls.preview_schedule(request))


class Admin:
    def __init__(self, client: Client) -> None:
        self._c = client

    def cluster(self) -> ClusterView:
        """Replicas, shard leaders, fences, lease TTLs (an admin token)."""
        return self._c.call(calls.cluster())

    def create_tenant(self, tenant_id: str, **fields: Any) -> Tenant:
        """Register a tenant: ``display_name``, ``weight``, ``quotas`` (a mapping or :class:`Quotas`),
        ``default_jitter_sec``."""
        return self._c.call(calls.create_tenant({"id": tenant_id, **fields}))

    def tenants(self, *, page_size: int = 100) -> Iterator[Tenant]:
        """Every registered tenant, in id order (pages fetched as needed)."""
        cursor: str | None = None
        while True:
            page = self._c.call(calls.list_tenants(cursor=cursor, limit=page_size))
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def tenant(self, tenant_id: str) -> Tenant:
        return self._c.call(calls.get_tenant(tenant_id))

    def update_tenant(self, tenant_id: str, **fields: Any) -> Tenant:
        """Change fields of a tenant; ``quotas`` changes the quotas it names (None: unlimited)."""
        return self._c.call(calls.update_tenant(tenant_id, fields))

    def suspend_tenant(self, tenant_id: str) -> Tenant:
        """Its writes are refused (403) and its jobs stop dispatching until resumed."""
        return self._c.call(calls.suspend_tenant(tenant_id))

    def resume_tenant(self, tenant_id: str) -> Tenant:
        return self._c.call(calls.resume_tenant(tenant_id))

    def create_pool(self, name: str, **fields: Any) -> Pool:
        """Register a pool and create its topic: ``owner`` or ``shared_with``, ``kind``, ``partitions``,
        ``retention_ms``, ``default_timeout_sec``, ``default_retry_policy``."""
        return self._c.call(calls.create_pool({"name": name, **fields}))

    def pools(self, *, page_size: int = 100) -> Iterator[Pool]:
        """Every registered pool, in name order (pages fetched as needed)."""
        return _pages(self._c, lambda cursor: calls.list_pools(cursor=cursor, limit=page_size))

    def pool(self, name: str) -> Pool:
        return self._c.call(calls.get_pool(name))

    def update_pool(self, name: str, **fields: Any) -> Pool:
        """Change who may use a pool (``owner`` or ``shared_with``), its ``kind`` or its job defaults."""
        return self._c.call(calls.update_pool(name, fields))

    def delete_pool(self, name: str) -> None:
        """Delete a pool no active job targets (else :class:`~sundial_client.errors.Conflict`, naming how many)."""
        self._c.call(calls.delete_pool(name))


class Pools:
    def __init__(self, client: Client) -> None:
        self._c = client

    def usable(self, *, page_size: int = 100) -> Iterator[Pool]:
        """The pools this client's tenant may send work into, in name order (``GET /v1/pools``)."""
        return _pages(self._c, lambda cursor: calls.list_pools(cursor=cursor, limit=page_size, mine=True))


def _pages(client: Client, page: Callable[[str | None], calls.Call[PoolList]]) -> Iterator[Pool]:
    cursor: str | None = None
    while True:
        answer = client.call(page(cursor))
        yield from answer.items
        if answer.next_cursor is None:
            return
        cursor = answer.next_cursor


class Breakers:
    """The tenant's retry circuit breakers, one per (pool, handler) its attempts ran on."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def list(self, *, pool: str | None = None, state: str | None = None) -> list[Breaker]:
        return self._c.call(calls.list_breakers(pool=pool, state=state)).items

    def get(self, breaker_id: str) -> Breaker:
        return self._c.call(calls.get_breaker(breaker_id))

    def open(self, breaker_id: str) -> Breaker:
        """Hold the handler's retries until :meth:`close` (an operator's open stays open)."""
        return self._c.call(calls.open_breaker(breaker_id))

    def close(self, breaker_id: str) -> Breaker:
        """Close it: its window starts again and its held retries are released, spread at random."""
        return self._c.call(calls.close_breaker(breaker_id))

    def audit(self, breaker_id: str) -> AuditPage:
        return self._c.call(calls.breaker_audit(breaker_id))


class Stats:
    """The tenant's history from the ClickHouse replica (seconds behind Postgres; kept past its retention)."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def executions(
        self,
        start: datetime | None = None,
        end: datetime | None = None,
        *,
        interval: str = "hour",
        group_by: str | None = None,
    ) -> ExecutionStats:
        """Counts, failure rate, lateness and duration percentiles per hour or day (and state, pool or handler)."""
        return self._c.call(calls.execution_stats(start, end, interval, group_by))

    def handlers(
        self, start: datetime | None = None, end: datetime | None = None, *, limit: int = 10
    ) -> HandlerRanking:
        """The slowest and the most failing handlers."""
        return self._c.call(calls.handler_stats(start, end, limit))


# --- asynchronous ---------------------------------------------------------------------------------


class AsyncClient:
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
        self.sleep = sleep
        self._http = httpx.AsyncClient(base_url=url, headers=_headers(token), timeout=timeout, transport=transport)
        self.jobs = AsyncJobs(self)
        self.executions = AsyncExecutions(self)
        self.schedules = AsyncSchedules(self)
        self.admin = AsyncAdmin(self)
        self.stats = AsyncStats(self)
        self.breakers = AsyncBreakers(self)

    async def call(self, call: Call[T]) -> T:
        """Send one operation, retrying what is safe to retry (see :mod:`sundial_client.retries`)."""
        headers = _request_headers(call)
        failures = 0
        while True:
            try:
                response = await self._http.request(
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

    @overload
    def schedule(
        self,
        *,
        handler: str,
        pool: str,
        at: datetime,
        name: str | None = ...,
        payload: Mapping[str, Any] | None = ...,
        **options: Any,
    ) -> Awaitable[Job]: ...

    @overload
    def schedule(
        self,
        *,
        handler: str,
        pool: str,
        at: None = ...,
        name: str | None = ...,
        payload: Mapping[str, Any] | None = ...,
        **options: Any,
    ) -> AsyncScheduleBuilder: ...

    def schedule(
        self,
        *,
        handler: str,
        pool: str,
        at: datetime | None = None,
        name: str | None = None,
        payload: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Awaitable[Job] | AsyncScheduleBuilder:
        """As :meth:`Client.schedule`; ``await`` the result (``await client.schedule(...).after(seconds=30)``)."""
        builder = AsyncScheduleBuilder(self.jobs, JobDraft(handler, pool, name, payload, options))
        return builder.at(at) if at is not None else builder

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncScheduleBuilder:
    def __init__(self, jobs: AsyncJobs, draft: JobDraft) -> None:
        self._jobs = jobs
        self.draft = draft

    async def at(self, when: datetime) -> Job:
        return await self._jobs.create(self.draft.at(when))

    async def after(self, seconds: float) -> Job:
        return await self._jobs.create(self.draft.after(seconds))

    async def cron(self, expression: str, tz: str = "UTC", **bounds: Any) -> Job:
        return await self._jobs.create(self.draft.cron(expression, tz, **bounds))

    async def every(self, seconds: int, **bounds: Any) -> Job:
        return await self._jobs.create(self.draft.every(seconds, **bounds))

    async def on(self, instants: Iterable[datetime], **bounds: Any) -> Job:
        return await self._jobs.create(self.draft.on(instants, **bounds))


class AsyncJobs:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(self, job: NewJob | Mapping[str, Any]) -> Job:
        """``POST /v1/jobs`` with an ``Idempotency-Key`` of its own: retried safely, created once."""
        return await self._c.call(calls.create_job(job))

    async def create_many(
        self, jobs: Iterable[NewJob | Mapping[str, Any]], *, chunk_size: int = MAX_BATCH
    ) -> list[BatchItem]:
        """As :meth:`Jobs.create_many`."""
        results: list[BatchItem] = []
        for chunk in _chunks(jobs, chunk_size):
            offset = len(results)
            answer = await self._c.call(calls.create_jobs(chunk))
            results += [item.model_copy(update={"index": offset + item.index}) for item in answer.results]
        return results

    async def get(self, job_id: str) -> JobDetail:
        return await self._c.call(calls.get_job(job_id))

    async def update(self, job_id: str, *, if_match: int | None = None, **fields: Any) -> Job:
        return await self._c.call(calls.update_job(job_id, fields, if_match))

    async def delete(self, job_id: str, *, cascade: bool = False) -> Job:
        return await self._c.call(calls.delete_job(job_id, cascade))

    async def backfill(self, job_id: str, start: datetime, end: datetime, **options: Any) -> Backfill:
        request = BackfillRequest(range_from=start, range_to=end, **options)
        return await self._c.call(calls.backfill_job(job_id, request))

    async def backfill_dry_run(self, job_id: str, start: datetime, end: datetime) -> BackfillDryRun:
        return await self._c.call(calls.backfill_dry_run(job_id, BackfillRequest(range_from=start, range_to=end)))

    async def get_backfill(self, backfill_id: str) -> Backfill:
        return await self._c.call(calls.get_backfill(backfill_id))

    async def cancel_backfill(self, backfill_id: str) -> Backfill:
        return await self._c.call(calls.cancel_backfill(backfill_id))

    async def pause(self, job_id: str) -> Job:
        return await self._c.call(calls.pause_job(job_id))

    async def resume(self, job_id: str) -> Job:
        return await self._c.call(calls.resume_job(job_id))

    async def trigger(self, job_id: str) -> Triggered:
        return await self._c.call(calls.trigger_job(job_id))

    async def preview(self, job_id: str, count: int = 10) -> Preview:
        return await self._c.call(calls.preview_job(job_id, count))

    async def list(
        self,
        *,
        state: JobState | str | None = None,
        type: JobType | str | None = None,
        pool: str | None = None,
        handler: str | None = None,
        name_prefix: str | None = None,
        page_size: int = 50,
    ) -> AsyncIterator[Job]:
        cursor: str | None = None
        while True:
            page = await self._c.call(
                calls.list_jobs(
                    state=state,
                    type=type,
                    pool=pool,
                    handler=handler,
                    name_prefix=name_prefix,
                    cursor=cursor,
                    limit=_check_page_size(page_size),
                )
            )
            for job in page.items:
                yield job
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def executions(self, job_id: str, *, page_size: int = 50) -> AsyncIterator[Execution]:
        cursor: str | None = None
        while True:
            page = await self._c.call(calls.job_executions(job_id, cursor=cursor, limit=_check_page_size(page_size)))
            for execution in page.items:
                yield execution
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def audit(self, job_id: str, *, actions: Sequence[str] = (), page_size: int = 100) -> AsyncIterator[AuditEntry]:
        return _audit_async(self._c, "jobs", job_id, actions, page_size)


class AsyncExecutions:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    def audit(
        self, execution_id: str, *, actions: Sequence[str] = (), page_size: int = 100
    ) -> AsyncIterator[AuditEntry]:
        return _audit_async(self._c, "executions", execution_id, actions, page_size)

    async def get(self, execution_id: str) -> ExecutionDetail:
        return await self._c.call(calls.get_execution(execution_id))

    async def cancel(self, execution_id: str) -> Execution:
        return await self._c.call(calls.cancel_execution(execution_id))

    async def retry(self, execution_id: str) -> Execution:
        return await self._c.call(calls.retry_execution(execution_id))

    async def list(
        self,
        state: ExecutionState | str | None = None,
        *,
        pool: str | None = None,
        handler: str | None = None,
        page_size: int = 50,
    ) -> AsyncIterator[Execution]:
        cursor: str | None = None
        while True:
            call = calls.list_executions(
                state, cursor=cursor, limit=_check_page_size(page_size), pool=pool, handler=handler
            )
            page = await self._c.call(call)
            for execution in page.items:
                yield execution
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def watch(self, execution_id: str, *, poll_sec: float = 1.0) -> AsyncIterator[ExecutionDetail]:
        last: tuple[Any, ...] | None = None
        while True:
            current = await self.get(execution_id)
            seen = (current.state, current.attempt, current.worker_id, current.next_attempt_at, len(current.attempts))
            if seen != last:
                last = seen
                yield current
            if current.ended:
                return
            await self._c.sleep(poll_sec)

    async def wait(self, execution_id: str, *, poll_sec: float = 1.0) -> ExecutionDetail:
        final: ExecutionDetail | None = None
        async for final in self.watch(execution_id, poll_sec=poll_sec):  # noqa: B007 - the last one is the answer
            pass
        assert final is not None
        return final


class AsyncSchedules:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def preview(self, request: SchedulePreviewRequest | Mapping[str, Any]) -> Preview:
        return await self._c.call(calls.preview_schedule(request))


class AsyncAdmin:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def cluster(self) -> ClusterView:
        return await self._c.call(calls.cluster())

    async def create_tenant(self, tenant_id: str, **fields: Any) -> Tenant:
        return await self._c.call(calls.create_tenant({"id": tenant_id, **fields}))

    async def tenant(self, tenant_id: str) -> Tenant:
        return await self._c.call(calls.get_tenant(tenant_id))

    async def update_tenant(self, tenant_id: str, **fields: Any) -> Tenant:
        return await self._c.call(calls.update_tenant(tenant_id, fields))

    async def suspend_tenant(self, tenant_id: str) -> Tenant:
        return await self._c.call(calls.suspend_tenant(tenant_id))

    async def resume_tenant(self, tenant_id: str) -> Tenant:
        return await self._c.call(calls.resume_tenant(tenant_id))

    async def create_pool(self, name: str, **fields: Any) -> Pool:
        return await self._c.call(calls.create_pool({"name": name, **fields}))

    async def pool(self, name: str) -> Pool:
        return await self._c.call(calls.get_pool(name))

    async def update_pool(self, name: str, **fields: Any) -> Pool:
        return await self._c.call(calls.update_pool(name, fields))

    async def delete_pool(self, name: str) -> None:
        await self._c.call(calls.delete_pool(name))


class AsyncBreakers:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def list(self, *, pool: str | None = None, state: str | None = None) -> list[Breaker]:
        return (await self._c.call(calls.list_breakers(pool=pool, state=state))).items

    async def get(self, breaker_id: str) -> Breaker:
        return await self._c.call(calls.get_breaker(breaker_id))

    async def open(self, breaker_id: str) -> Breaker:
        return await self._c.call(calls.open_breaker(breaker_id))

    async def close(self, breaker_id: str) -> Breaker:
        return await self._c.call(calls.close_breaker(breaker_id))

    async def audit(self, breaker_id: str) -> AuditPage:
        return await self._c.call(calls.breaker_audit(breaker_id))


class AsyncStats:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def executions(
        self,
        start: datetime | None = None,
        end: datetime | None = None,
        *,
        interval: str = "hour",
        group_by: str | None = None,
    ) -> ExecutionStats:
        return await self._c.call(calls.execution_stats(start, end, interval, group_by))

    async def handlers(
        self, start: datetime | None = None, end: datetime | None = None, *, limit: int = 10
    ) -> HandlerRanking:
        return await self._c.call(calls.handler_stats(start, end, limit))
