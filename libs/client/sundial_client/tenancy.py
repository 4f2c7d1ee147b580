"""The tenant's smaller namespaces: ``client.pools`` (where it may send work), ``client.breakers`` (its retry
circuit breakers), ``client.stats`` (its history) and ``client.schedules`` (trying a schedule).

Written once, over asyncio; the blocking client runs these same methods on its own event loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from typing import Any

from sundial_client import calls
from sundial_client.admin import MAX_REGISTRY_PAGE
from sundial_client.caller import Caller, check_page_size, pages
from sundial_client.models import (
    AuditPage,
    Breaker,
    ExecutionStats,
    HandlerRanking,
    Pool,
    PoolDetail,
    PoolTargetView,
    PoolTokenIssued,
    PoolTokenView,
    Preview,
    SchedulePreviewRequest,
)


class AsyncPools:
    """``client.pools``."""

    def __init__(self, client: Caller) -> None:
        self.client = client

    def usable(self, *, page_size: int = 100) -> AsyncIterator[Pool]:
        """The pools this client's tenant may send work into, in name order (``GET /v1/pools``)."""
        size = check_page_size(page_size, MAX_REGISTRY_PAGE)
        return pages(self.client, lambda cursor: calls.list_pools(cursor=cursor, limit=size, mine=True))

    async def show(self, name: str) -> PoolDetail:
        """A pool this client's tenant may use: its live workers (handlers, free slots) and the tenant's backlog."""
        return await self.client.call(calls.pool_detail(name))

    async def create_token(
        self, name: str, *, tenant: str | None = None, subject: str | None = None, ttl_sec: int | None = None
    ) -> PoolTokenIssued:
        """Mint a pool token for workers behind the worker gateway (an admin, or the pool's owning tenant; a shared
        pool's token names the ``tenant`` whose work it takes). ``token`` is in the answer this once."""
        fields = {"tenant": tenant, "subject": subject, "ttl_sec": ttl_sec}
        return await self.client.call(calls.create_pool_token(name, {k: v for k, v in fields.items() if v is not None}))

    async def tokens(self, name: str, *, limit: int = 100) -> list[PoolTokenView]:
        """The pool's tokens, newest first, revoked ones included."""
        return (await self.client.call(calls.list_pool_tokens(name, limit=limit))).items

    async def revoke_token(self, name: str, token_id: str) -> None:
        """Revoke a pool token: the worker gateway refuses it within seconds."""
        await self.client.call(calls.revoke_pool_token(name, token_id))

    async def set_target(
        self, name: str, url: str, *, paths: Mapping[str, str] | None = None, rotate_secret: bool = False
    ) -> PoolTargetView:
        """Set where an HTTP pool's executions are POSTed (the pool's owner). ``secret`` is in full in the answer
        only when it was just made: the first time, or with ``rotate_secret``."""
        fields: dict[str, Any] = {"url": url, "rotate_secret": rotate_secret}
        if paths is not None:
            fields["paths"] = dict(paths)
        return await self.client.call(calls.put_pool_target(name, fields))

    async def target(self, name: str) -> PoolTargetView:
        """An HTTP pool's target, its secret redacted."""
        return await self.client.call(calls.get_pool_target(name))

    async def complete(
        self,
        pool: str,
        execution_id: str,
        attempt: int,
        token: str,
        *,
        result: Any = None,
        error: str | None = None,
        retry: bool = True,
    ) -> None:
        """Finish an attempt the target accepted (202): succeeded with ``result``, or failed with ``error`` (retried
        by the job's policy unless ``retry`` is false). ``token`` is the request's ``completionToken``."""
        fields: dict[str, Any] = {"outcome": "failed" if error is not None else "succeeded"}
        if error is not None:
            fields.update(error=error, retry=retry)
        elif result is not None:
            fields["result"] = result
        await self.client.call(calls.complete_target_attempt(pool, execution_id, attempt, token, fields))


class AsyncBreakers:
    """``client.breakers``: the tenant's retry circuit breakers, one per (pool, handler) its attempts ran on."""

    def __init__(self, client: Caller) -> None:
        self.client = client

    async def list(self, *, pool: str | None = None, state: str | None = None) -> list[Breaker]:
        return (await self.client.call(calls.list_breakers(pool=pool, state=state))).items

    async def get(self, breaker_id: str) -> Breaker:
        return await self.client.call(calls.get_breaker(breaker_id))

    async def open(self, breaker_id: str) -> Breaker:
        """Hold the handler's retries until :meth:`close` (an operator's open stays open)."""
        return await self.client.call(calls.open_breaker(breaker_id))

    async def close(self, breaker_id: str) -> Breaker:
        """Close it: its window starts again and its held retries are released, spread at random."""
        return await self.client.call(calls.close_breaker(breaker_id))

    async def audit(self, breaker_id: str) -> AuditPage:
        return await self.client.call(calls.breaker_audit(breaker_id))


class AsyncStats:
    """``client.stats``: the tenant's history from the ClickHouse replica (seconds behind Postgres; kept past
    its retention)."""

    def __init__(self, client: Caller) -> None:
        self.client = client

    async def executions(
        self,
        start: datetime | None = None,
        end: datetime | None = None,
        *,
        interval: str = "hour",
        group_by: str | None = None,
    ) -> ExecutionStats:
        """Counts, failure rate, lateness and duration percentiles per hour or day (and state, pool or handler)."""
        return await self.client.call(calls.execution_stats(start, end, interval, group_by))

    async def handlers(
        self, start: datetime | None = None, end: datetime | None = None, *, limit: int = 10
    ) -> HandlerRanking:
        """The slowest and the most failing handlers."""
        return await self.client.call(calls.handler_stats(start, end, limit))


class AsyncSchedules:
    """``client.schedules``."""

    def __init__(self, client: Caller) -> None:
        self.client = client

    async def preview(self, request: SchedulePreviewRequest | Mapping[str, Any]) -> Preview:
        """The next fires of a schedule, without creating anything."""
        return await self.client.call(calls.preview_schedule(request))
