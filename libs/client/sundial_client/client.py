"""``Client``: every Sundial API operation over blocking calls — :class:`AsyncClient` run on a loop of its own.

The namespaces here are the asynchronous ones (``sundial_client.jobs``, ``.executions``, …) made blocking
method by method (:mod:`sundial_client.blocking`), so an operation, its retries and its paging are written
once; listings are iterators that fetch the next page as they go.

    with Client("http://127.0.0.1:8080", token=token) as client:
        job = client.schedule(handler="echo", pool="demo").after(seconds=30)
        for job in client.jobs.list(state="ACTIVE"):
            ...
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Self, TypeVar

import httpx

from sundial_client.admin import AsyncAdmin
from sundial_client.async_client import DEFAULT_TIMEOUT_SEC, AsyncClient
from sundial_client.blocking import Blocking, LoopThread, async_sleep, async_transport, blocking, blocking_iter
from sundial_client.bulk import AsyncBulk
from sundial_client.calls import Call
from sundial_client.executions import AsyncExecutions
from sundial_client.jobs import AsyncJobs, AsyncScheduleBuilder, JobDraft, Scheduling
from sundial_client.models import Job
from sundial_client.notifications import AsyncNotifications
from sundial_client.replays import AsyncReplays
from sundial_client.retries import Retries
from sundial_client.tenancy import AsyncBreakers, AsyncPools, AsyncSchedules, AsyncStats

__all__ = ["AsyncClient", "Client"]

T = TypeVar("T")


class Jobs(Blocking):
    """``client.jobs`` (see :class:`~sundial_client.jobs.AsyncJobs`)."""

    create = blocking(AsyncJobs.create)
    create_many = blocking(AsyncJobs.create_many)
    get = blocking(AsyncJobs.get)
    by_key = blocking(AsyncJobs.by_key)
    resolve = blocking(AsyncJobs.resolve)
    named = blocking(AsyncJobs.named)
    update = blocking(AsyncJobs.update)
    delete = blocking(AsyncJobs.delete)
    backfill = blocking(AsyncJobs.backfill)
    backfill_dry_run = blocking(AsyncJobs.backfill_dry_run)
    backfills = blocking_iter(AsyncJobs.backfills)
    get_backfill = blocking(AsyncJobs.get_backfill)
    cancel_backfill = blocking(AsyncJobs.cancel_backfill)
    pause = blocking(AsyncJobs.pause)
    resume = blocking(AsyncJobs.resume)
    trigger = blocking(AsyncJobs.trigger)
    preview = blocking(AsyncJobs.preview)
    list = blocking_iter(AsyncJobs.list)
    executions = blocking_iter(AsyncJobs.executions)
    audit = blocking_iter(AsyncJobs.audit)


class ScheduleBuilder(Blocking):
    """The when of ``client.schedule(...)`` (see :class:`~sundial_client.jobs.AsyncScheduleBuilder`)."""

    at = blocking(AsyncScheduleBuilder.at)
    after = blocking(AsyncScheduleBuilder.after)
    cron = blocking(AsyncScheduleBuilder.cron)
    every = blocking(AsyncScheduleBuilder.every)
    on = blocking(AsyncScheduleBuilder.on)


class Executions(Blocking):
    """``client.executions`` (see :class:`~sundial_client.executions.AsyncExecutions`)."""

    get = blocking(AsyncExecutions.get)
    cancel = blocking(AsyncExecutions.cancel)
    retry = blocking(AsyncExecutions.retry)
    list = blocking_iter(AsyncExecutions.list)
    audit = blocking_iter(AsyncExecutions.audit)
    watch = blocking_iter(AsyncExecutions.watch)
    wait = blocking(AsyncExecutions.wait)


class Admin(Blocking):
    """``client.admin`` (see :class:`~sundial_client.admin.AsyncAdmin`)."""

    cluster = blocking(AsyncAdmin.cluster)
    create_tenant = blocking(AsyncAdmin.create_tenant)
    tenants = blocking_iter(AsyncAdmin.tenants)
    tenant = blocking(AsyncAdmin.tenant)
    update_tenant = blocking(AsyncAdmin.update_tenant)
    suspend_tenant = blocking(AsyncAdmin.suspend_tenant)
    resume_tenant = blocking(AsyncAdmin.resume_tenant)
    create_pool = blocking(AsyncAdmin.create_pool)
    pools = blocking_iter(AsyncAdmin.pools)
    pool = blocking(AsyncAdmin.pool)
    update_pool = blocking(AsyncAdmin.update_pool)
    delete_pool = blocking(AsyncAdmin.delete_pool)
    allow_destination = blocking(AsyncAdmin.allow_destination)
    allowed_destinations = blocking(AsyncAdmin.allowed_destinations)
    revoke_destination = blocking(AsyncAdmin.revoke_destination)


class Pools(Blocking):
    usable = blocking_iter(AsyncPools.usable)
    show = blocking(AsyncPools.show)
    create_token = blocking(AsyncPools.create_token)
    tokens = blocking(AsyncPools.tokens)
    revoke_token = blocking(AsyncPools.revoke_token)
    set_target = blocking(AsyncPools.set_target)
    target = blocking(AsyncPools.target)
    complete = blocking(AsyncPools.complete)


class Breakers(Blocking):
    list = blocking(AsyncBreakers.list)
    get = blocking(AsyncBreakers.get)
    open = blocking(AsyncBreakers.open)
    close = blocking(AsyncBreakers.close)
    audit = blocking(AsyncBreakers.audit)


class Notifications(Blocking):
    subscribe = blocking(AsyncNotifications.subscribe)
    list = blocking(AsyncNotifications.list)
    get = blocking(AsyncNotifications.get)
    delete = blocking(AsyncNotifications.delete)
    rotate_secret = blocking(AsyncNotifications.rotate_secret)
    deliveries = blocking(AsyncNotifications.deliveries)
    test = blocking(AsyncNotifications.test)


class Stats(Blocking):
    executions = blocking(AsyncStats.executions)
    handlers = blocking(AsyncStats.handlers)


class Schedules(Blocking):
    preview = blocking(AsyncSchedules.preview)


class Replays(Blocking):
    create = blocking(AsyncReplays.create)
    get = blocking(AsyncReplays.get)
    cancel = blocking(AsyncReplays.cancel)
    list = blocking_iter(AsyncReplays.list)
    runs = blocking_iter(AsyncReplays.runs)
    watch = blocking_iter(AsyncReplays.watch)


class Bulk(Blocking):
    create = blocking(AsyncBulk.create)
    preview = blocking(AsyncBulk.preview)
    redrive = blocking(AsyncBulk.redrive)
    get = blocking(AsyncBulk.get)
    cancel = blocking(AsyncBulk.cancel)
    list = blocking_iter(AsyncBulk.list)
    items = blocking_iter(AsyncBulk.items)
    watch = blocking_iter(AsyncBulk.watch)


class Client(Scheduling[Job, ScheduleBuilder]):
    """The Sundial API over blocking calls. ``Client(url, token=...)``; close it, or use it in ``with``.

    ``transport`` may be a blocking or an asynchronous httpx transport; ``sleep`` (seconds → None) replaces
    the wait between retries and polls. A client may be used from several threads at once.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_SEC,
        retry: Retries | None = None,
        transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], object] | None = None,
    ) -> None:
        self.bridge = LoopThread()
        # A client dropped without close() still stops its loop's thread when it is collected.
        weakref.finalize(self, self.bridge.close)
        self.inner = AsyncClient(
            url, token, timeout=timeout, retry=retry, transport=async_transport(transport), sleep=async_sleep(sleep)
        )
        self.retry = self.inner.retry
        self.jobs = Jobs(self.bridge, self.inner.jobs)
        self.executions = Executions(self.bridge, self.inner.executions)
        self.schedules = Schedules(self.bridge, self.inner.schedules)
        self.admin = Admin(self.bridge, self.inner.admin)
        self.pools = Pools(self.bridge, self.inner.pools)
        self.replays = Replays(self.bridge, self.inner.replays)
        self.bulk = Bulk(self.bridge, self.inner.bulk)
        self.stats = Stats(self.bridge, self.inner.stats)
        self.breakers = Breakers(self.bridge, self.inner.breakers)
        self.notifications = Notifications(self.bridge, self.inner.notifications)

    def call(self, call: Call[T]) -> T:
        """Send one operation, retrying what is safe to retry (see :mod:`sundial_client.retries`)."""
        return self.bridge.run(self.inner.call(call))

    def builder(self, draft: JobDraft) -> ScheduleBuilder:
        return ScheduleBuilder(self.bridge, AsyncScheduleBuilder(self.inner.jobs, draft))

    def close(self) -> None:
        """Close the connections and stop the client's loop; safe twice."""
        if self.bridge.started:
            self.bridge.run(self.inner.aclose())
        self.bridge.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
