"""The bulk-operations runner: fixes each operation's selection, then acts on it at its rate, in the replayer.

The replayer is where Sundial's long operations run: one active replica (elected), resuming from what Postgres
holds after a crash or a change of leader, and off the dispatch path — a bulk operation's work is a stream of
compare-and-swaps on rows (a re-drive only schedules a retry; the dispatcher's fair queue and the retry breaker
then treat it like any retry), so it needs neither a shard's fence nor the hot window.

Each pass (``run_once``):

1. **Prepare** every PREPARING operation: its selection is fixed in one statement
   (:meth:`~sundial_common.stores.bulk.PostgresBulkStore.prepare`), RUNNING with its total.
2. **Act**: each tenant's oldest RUNNING operations (``per_tenant``, default one) get a turn of ``slice_sec``, all
   tenants' turns at once; a turn acts batch by batch (:meth:`~sundial_common.stores.bulk.PostgresBulkStore.act`:
   a batch's actions, outcomes and cursor commit together, so no id is acted on twice) paced to the operation's
   rate, capped so that one tenant's operations together stay within ``tenant_rate_per_sec``.
3. **Purge** finished operations older than ``retention_days``, once every ``purge_every_sec``.

A failing pass (Postgres away) leaves every operation where its last commit put it; the next pass goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from redis.exceptions import RedisError
from sundial_common.hotwindow.window import HotWindow
from sundial_common.observability.metrics import BULK_ITEMS, BULK_OPERATIONS_ACTIVE
from sundial_common.runtime.pacing import Pacer
from sundial_common.stores.bulk import Batch, BulkStore

log = logging.getLogger("sundial.replayer.bulk")


@dataclass(frozen=True)
class BulkConfig:
    #: Seconds between passes while there is nothing to do...
    interval_sec: float = 0.5
    #: ...doubling up to this while passes keep finding nothing: a new operation starts within this.
    idle_interval_sec: float = 2.0
    #: Longest turn of the operations in a pass (they take their turns at once, one per tenant by default).
    slice_sec: float = 2.0
    #: Most rows a second one tenant's operations act on together (an operation's own rate is capped to it).
    tenant_rate_per_sec: int = 1000
    #: Operations of one tenant that run at a time; the others wait RUNNING (their selection fixed) in order.
    per_tenant: int = 1
    #: Most unfinished operations looked at per pass.
    max_active: int = 256
    #: Finished operations are deleted (with their items) this many days after they finished.
    retention_days: float = 30.0
    #: Seconds between retention purges.
    purge_every_sec: float = 300.0

    def __post_init__(self) -> None:
        for name in ("interval_sec", "idle_interval_sec", "slice_sec", "retention_days", "purge_every_sec"):
            if getattr(self, name) <= 0:
                raise ValueError(f"BulkConfig.{name} must be > 0")
        for name in ("tenant_rate_per_sec", "per_tenant", "max_active"):
            if getattr(self, name) < 1:
                raise ValueError(f"BulkConfig.{name} must be >= 1")


@dataclass
class BulkPassResult:
    #: Unfinished operations seen (a pass with any goes again at once).
    active: int = 0
    prepared: int = 0
    resumed: int = 0
    batches: int = 0
    done: int = 0
    skipped: int = 0
    failed: int = 0
    finished: int = 0
    purged: int = 0


@dataclass
class _Held:
    pacer: Pacer
    counted: dict[str, int] = field(default_factory=dict)


class BulkRunner:
    """Runs bulk operations; safe to drive one pass at a time (``run_once``) from tests."""

    def __init__(self, store: BulkStore, config: BulkConfig | None = None, hot_window: HotWindow | None = None) -> None:
        self.config = config or BulkConfig()
        self._store = store
        #: Where a re-drive's retries, due now, are announced to the shard leaders (without it, or with Redis away,
        #: the hydrator's overdue scan finds them, seconds later).
        self._hot_window = hot_window
        #: Operations this runner has acted on: a RUNNING one with progress not in here was left by another.
        self._held: dict[UUID, _Held] = {}
        self._purged_at: float | None = None

    async def run_once(self) -> BulkPassResult:
        result = BulkPassResult()
        rows = await self._store.active(self.config.max_active)
        result.active = len(rows)
        BULK_OPERATIONS_ACTIVE.set(len(rows))
        running: dict[str, list[Mapping[str, Any]]] = {}
        for row in rows:
            if row["state"] == "PREPARING":
                prepared = await self._store.prepare(row["id"])
                if prepared is None:
                    continue
                result.prepared += 1
                log.info("bulk operation %s selected %s rows: %s", row["id"], prepared["total"], prepared["state"])
                if prepared["state"] != "RUNNING":
                    result.finished += 1
                    continue
                row = prepared
            running.setdefault(row["tenant_id"], []).append(row)
        turns = [op for ops in running.values() for op in ops[: self.config.per_tenant]]
        for held in set(self._held) - {op["id"] for op in turns}:
            if held not in {r["id"] for r in rows}:
                del self._held[held]  # finished (or cancelled) elsewhere
        counts = await asyncio.gather(*(self._safe_turn(op, len(running[op["tenant_id"]]), result) for op in turns))
        for outcomes in counts:
            result.done += outcomes.get("DONE", 0)
            result.skipped += outcomes.get("SKIPPED", 0)
            result.failed += outcomes.get("FAILED", 0)
        await self._purge(result)
        return result

    def _rate(self, op: Mapping[str, Any], of_tenant: int) -> float:
        share = self.config.tenant_rate_per_sec / min(of_tenant, self.config.per_tenant)
        return float(min(op["rate_per_sec"], share))

    async def _safe_turn(self, op: Mapping[str, Any], of_tenant: int, result: BulkPassResult) -> dict[str, int]:
        # One operation's trouble (Postgres away mid-turn) must not end the others' turns: it stays where its
        # last committed batch put it, and the next pass goes on from there.
        try:
            return await self._turn(op, of_tenant, result)
        except Exception:
            log.exception("bulk operation %s: turn failed; it resumes at the next pass", op["id"])
            self._held.pop(op["id"], None)
            return {}

    async def _turn(self, op: Mapping[str, Any], of_tenant: int, result: BulkPassResult) -> dict[str, int]:
        op_id: UUID = op["id"]
        rate = self._rate(op, of_tenant)
        held = self._held.get(op_id)
        if held is None:
            if op["cursor_seq"] > 0:
                await self._store.resumed(op_id)
                result.resumed += 1
                log.info("bulk operation %s resumed after item %s", op_id, op["cursor_seq"])
            held = self._held[op_id] = _Held(Pacer(rate))
        elif held.pacer.rate != rate:
            held.pacer = Pacer(rate)
        outcomes: dict[str, int] = {}
        deadline = time.monotonic() + self.config.slice_sec
        while time.monotonic() < deadline:
            chunk = held.pacer.chunk()
            await held.pacer.wait(chunk)
            batch = await self._store.act(op_id, chunk)
            await self._announce(batch)
            result.batches += 1
            for outcome, n in batch.outcomes.items():
                outcomes[outcome] = outcomes.get(outcome, 0) + n
                BULK_ITEMS.labels(op["target"], op["action"], outcome.lower()).inc(n)
            after = batch.operation
            if after is None or after["state"] != "RUNNING":
                self._held.pop(op_id, None)
                if after is not None:
                    result.finished += 1
                    log.info(
                        "bulk operation %s %s: %s done, %s skipped, %s failed",
                        op_id,
                        after["state"],
                        after["done"],
                        after["skipped"],
                        after["failed"],
                    )
                break
        return outcomes

    async def _announce(self, batch: Batch) -> None:
        if self._hot_window is None or not batch.retries:
            return
        try:
            for shard, retries in batch.retries.items():
                await self._hot_window.add_retries(shard, retries)
        except (RedisError, OSError) as exc:
            log.warning("re-driven retries not added to the hot window (the hydrator will): %r", exc)

    async def _purge(self, result: BulkPassResult) -> None:
        now = time.monotonic()
        if self._purged_at is not None and now - self._purged_at < self.config.purge_every_sec:
            return
        self._purged_at = now
        result.purged = await self._store.purge(self.config.retention_days, 1000)
