"""``client.jobs``: register, read, list, change, pause, resume, trigger, preview, backfill and cancel jobs.

Written once, over asyncio (:class:`AsyncJobs`); the blocking client runs these same methods on its own event
loop. ``client.schedule(handler=…, pool=…)`` starts a :class:`JobDraft` that ``.at``/``.after``/``.cron``/
``.every``/``.on`` complete and register.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar, cast, overload
from uuid import UUID

from sundial_client import calls
from sundial_client.caller import Caller, check_page_size, pages
from sundial_client.calls import MAX_BATCH
from sundial_client.models import (
    AuditEntry,
    Backfill,
    BackfillDryRun,
    BackfillRequest,
    BatchItem,
    Execution,
    Job,
    JobDetail,
    JobState,
    JobType,
    NewJob,
    Preview,
    Target,
    Triggered,
)


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


def is_job_id(ref: str) -> bool:
    """Whether ``ref`` is a job id (a UUID) rather than a job key (which is never one)."""
    try:
        UUID(ref)
    except ValueError:
        return False
    return True


def chunks(items: Iterable[NewJob | Mapping[str, Any]], size: int) -> Iterable[list[Any]]:
    """Jobs as wire bodies, ``size`` at a time (``POST /v1/jobs:batch`` takes at most ``MAX_BATCH``)."""
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


Now = TypeVar("Now")
Now_co = TypeVar("Now_co", covariant=True)


class Builder(Protocol[Now_co]):
    """What ``schedule(...)`` answers when no ``at`` is given: the rest of the when."""

    def at(self, when: datetime) -> Now_co: ...


Later = TypeVar("Later", bound=Builder[Any])


class Scheduling(Generic[Now, Later]):
    """``client.schedule(...)``, written once: ``Now`` is what registering answers (a job, or an awaitable of
    one), ``Later`` the builder that waits for the when."""

    def builder(self, draft: JobDraft) -> Later:
        raise NotImplementedError

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
    ) -> Now: ...

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
    ) -> Later: ...

    def schedule(
        self,
        *,
        handler: str,
        pool: str,
        at: datetime | None = None,
        name: str | None = None,
        payload: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Now | Later:
        """Register a job for ``handler`` in ``pool``: at once when ``at`` is given, else say when next
        (``.after(seconds=30)``, ``.cron("0 3 * * *", tz=...)``, ``.every(60)``, ``.at(dt)``, ``.on([...])``).
        ``options`` are any other job fields (``retry_policy=``, ``timeout_sec=``, ``jitter_sec=``, …); the
        asynchronous client's answer is awaited."""
        builder = self.builder(JobDraft(handler, pool, name, payload, options))
        return cast(Now, builder.at(at)) if at is not None else builder


class AsyncScheduleBuilder:
    """The when of a :class:`JobDraft`; each method registers the job and answers it."""

    def __init__(self, jobs: AsyncJobs, draft: JobDraft) -> None:
        self.jobs = jobs
        self.draft = draft

    async def at(self, when: datetime) -> Job:
        return await self.jobs.create(self.draft.at(when))

    async def after(self, seconds: float) -> Job:
        return await self.jobs.create(self.draft.after(seconds))

    async def cron(self, /, expression: str, tz: str = "UTC", **bounds: Any) -> Job:
        return await self.jobs.create(self.draft.cron(expression, tz, **bounds))

    async def every(self, /, seconds: int, **bounds: Any) -> Job:
        return await self.jobs.create(self.draft.every(seconds, **bounds))

    async def on(self, /, instants: Iterable[datetime], **bounds: Any) -> Job:
        return await self.jobs.create(self.draft.on(instants, **bounds))


class AsyncJobs:
    """``client.jobs``."""

    def __init__(self, client: Caller) -> None:
        self.client = client

    async def create(self, job: NewJob | Mapping[str, Any]) -> Job:
        """``POST /v1/jobs`` with an ``Idempotency-Key`` of its own: retried safely, created once."""
        return await self.client.call(calls.create_job(job))

    async def create_many(
        self, jobs: Iterable[NewJob | Mapping[str, Any]], *, chunk_size: int = MAX_BATCH
    ) -> list[BatchItem]:
        """``POST /v1/jobs:batch`` per ``chunk_size`` jobs (each chunk idempotent on retry); one result per job,
        ``index`` counting from the first job given. Invalid items come back with their ``problem``."""
        results: list[BatchItem] = []
        for chunk in chunks(jobs, chunk_size):
            offset = len(results)
            answer = await self.client.call(calls.create_jobs(chunk))
            results += [item.model_copy(update={"index": offset + item.index}) for item in answer.results]
        return results

    async def get(self, job_id: str) -> JobDetail:
        return await self.client.call(calls.get_job(job_id))

    async def by_key(self, key: str) -> JobDetail:
        """The job registered with ``key`` (``NotFound`` when the tenant has none)."""
        return await self.client.call(calls.get_job_by_key(key))

    async def resolve(self, ref: str) -> str:
        """The id of the job ``ref`` names: a job id as it is, else the job registered with that key."""
        return ref if is_job_id(ref) else (await self.by_key(ref)).job_id

    async def named(self, name: str, *, page_size: int = 50) -> list[Job]:
        """The jobs called exactly ``name``, newest first (names are labels for people: several may share one)."""
        found = pages(
            self.client,
            lambda cursor: calls.list_jobs(
                state=None, type=None, pool=None, handler=None, name_prefix=name, cursor=cursor, limit=page_size
            ),
        )
        return [job async for job in found if job.name == name]

    async def update(self, /, job_id: str, *, if_match: int | None = None, **fields: Any) -> Job:
        """``PATCH``: the fields given change (snake_case names; None clears one); ``if_match`` a version."""
        return await self.client.call(calls.update_job(job_id, fields, if_match))

    async def delete(self, job_id: str, *, cascade: bool = False) -> Job:
        """Cancel the job; a job DEPENDENT jobs wait on is refused (409) unless ``cascade`` cancels them too."""
        return await self.client.call(calls.delete_job(job_id, cascade))

    async def backfill(self, /, job_id: str, start: datetime, end: datetime, **options: Any) -> Backfill:
        """``POST /v1/jobs/{id}:backfill``: run the occurrences of ``[start, end)`` that have no execution
        (``overlap_policy``, ``rate_per_sec``); follow it with :meth:`get_backfill`."""
        request = BackfillRequest(range_from=start, range_to=end, **options)
        return await self.client.call(calls.backfill_job(job_id, request))

    async def backfill_dry_run(self, job_id: str, start: datetime, end: datetime) -> BackfillDryRun:
        """How many occurrences of ``[start, end)`` a backfill would run, and the first ones; nothing created."""
        request = BackfillRequest(range_from=start, range_to=end)
        return await self.client.call(calls.backfill_dry_run(job_id, request))

    def backfills(self, job_id: str, *, page_size: int = 50) -> AsyncIterator[Backfill]:
        """The job's backfills, newest first."""
        size = check_page_size(page_size)
        return pages(self.client, lambda cursor: calls.job_backfills(job_id, cursor=cursor, limit=size))

    async def get_backfill(self, backfill_id: str) -> Backfill:
        return await self.client.call(calls.get_backfill(backfill_id))

    async def cancel_backfill(self, backfill_id: str) -> Backfill:
        return await self.client.call(calls.cancel_backfill(backfill_id))

    async def pause(self, job_id: str) -> Job:
        return await self.client.call(calls.pause_job(job_id))

    async def resume(self, job_id: str) -> Job:
        return await self.client.call(calls.resume_job(job_id))

    async def trigger(self, job_id: str) -> Triggered:
        """One run now, outside the schedule; its execution is readable at once (PENDING until dispatched)."""
        return await self.client.call(calls.trigger_job(job_id))

    async def preview(self, job_id: str, count: int = 10) -> Preview:
        return await self.client.call(calls.preview_job(job_id, count))

    def list(
        self,
        *,
        state: JobState | str | None = None,
        type: JobType | str | None = None,
        pool: str | None = None,
        handler: str | None = None,
        name_prefix: str | None = None,
        key: str | None = None,
        page_size: int = 50,
    ) -> AsyncIterator[Job]:
        """The tenant's jobs, newest first, filtered by what is given; pages are fetched as they are used."""
        size = check_page_size(page_size)
        return pages(
            self.client,
            lambda cursor: calls.list_jobs(
                state=state,
                type=type,
                pool=pool,
                handler=handler,
                name_prefix=name_prefix,
                key=key,
                cursor=cursor,
                limit=size,
            ),
        )

    def executions(self, job_id: str, *, page_size: int = 50) -> AsyncIterator[Execution]:
        """The job's executions, newest occurrence first."""
        size = check_page_size(page_size)
        return pages(self.client, lambda cursor: calls.job_executions(job_id, cursor=cursor, limit=size))

    def audit(self, job_id: str, *, actions: Sequence[str] = (), page_size: int = 100) -> AsyncIterator[AuditEntry]:
        """The job's audit trail, oldest first: every change, who made it (token subject), before and after.

        ``actions=["cancel"]`` answers "who cancelled this job?".
        """
        size = check_page_size(page_size)
        return pages(
            self.client, lambda cursor: calls.audit("jobs", job_id, actions=actions, cursor=cursor, limit=size)
        )
