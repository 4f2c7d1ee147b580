"""``client.bulk``: one action on every job or execution a filter selects, run by the server in the background.

``client.bulk.redrive(state="DEAD", pool="payments", finished_from=…)`` re-drives what went DEAD; ``preview`` (the
same arguments) answers the exact count and the first rows instead; ``watch`` follows an operation until it ends.
Filter keywords: ``state``, ``pool``, ``handler``, ``labels``, ``name_prefix``, ``priority``, ``scheduled_from``,
``scheduled_to``, ``finished_from``, ``finished_to``, ``job_ids``. Written once, over asyncio; the blocking client
runs these same methods on its loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from sundial_client import calls
from sundial_client.caller import Caller, check_page_size, pages
from sundial_client.models.bulk import FINAL_STATES, BulkDryRun, BulkItem, BulkOperation, BulkState

__all__ = ["FINAL_STATES", "AsyncBulk", "BulkDryRun", "BulkItem", "BulkOperation", "BulkState"]


class AsyncBulk:
    """``client.bulk``."""

    def __init__(self, client: Caller) -> None:
        self.client = client

    async def create(
        self,
        /,
        target: str,
        action: str,
        *,
        rate_per_sec: int | None = None,
        tenant_id: str | None = None,
        **filter: Any,
    ) -> BulkOperation:
        """Start an operation (PREPARING): ``action`` on every row of ``target`` (executions, jobs) the filter
        selects now."""
        body = calls.bulk_body(target, action, filter, rate_per_sec=rate_per_sec, tenant_id=tenant_id)
        return await self.client.call(calls.create_bulk(body))

    async def preview(self, /, target: str, action: str, *, tenant_id: str | None = None, **filter: Any) -> BulkDryRun:
        """What :meth:`create` would act on now: the exact count and the first 20 rows. Changes nothing."""
        body = calls.bulk_body(target, action, filter, tenant_id=tenant_id)
        return await self.client.call(calls.preview_bulk(body))

    async def redrive(self, /, **fields: Any) -> BulkOperation:
        """Re-drive executions: a DEAD one (or a FAILED one a breaker holds) gets a new attempt."""
        return await self.create("executions", "redrive", **fields)

    async def get(self, operation_id: str) -> BulkOperation:
        return await self.client.call(calls.get_bulk(operation_id))

    async def cancel(self, operation_id: str) -> BulkOperation:
        """PREPARING: CANCELLED at once; RUNNING: stops before its next batch."""
        return await self.client.call(calls.cancel_bulk(operation_id))

    def list(self, *, page_size: int = 50) -> AsyncIterator[BulkOperation]:
        size = check_page_size(min(page_size, calls.MAX_PAGE))
        return pages(self.client, lambda cursor: calls.list_bulk(cursor=cursor, limit=size))

    def items(self, operation_id: str, *, outcome: str | None = None, page_size: int = 200) -> AsyncIterator[BulkItem]:
        """Each selected row's outcome and why, in the order acted on (``outcome``: only DONE, SKIPPED or FAILED)."""
        size = check_page_size(min(page_size, calls.MAX_ITEMS_PAGE), calls.MAX_ITEMS_PAGE)
        return pages(
            self.client, lambda cursor: calls.bulk_items(operation_id, outcome=outcome, cursor=cursor, limit=size)
        )

    async def watch(self, operation_id: str, *, poll_sec: float = 1.0) -> AsyncIterator[BulkOperation]:
        """The operation now, then every ``poll_sec`` until it has ended."""
        while True:
            current = await self.get(operation_id)
            yield current
            if current.ended:
                return
            await self.client.sleep(poll_sec)
