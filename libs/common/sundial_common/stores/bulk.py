"""The bulk-operations store: an action on every job or execution a filter selects, from the request to each row's
outcome.

``POST /v1/bulk-operations`` writes one ``bulk_operations`` row in PREPARING (:meth:`PostgresBulkStore.create`); its
``created_at`` is the selection's watermark. The runner fixes the selection (:meth:`PostgresBulkStore.prepare`: the
ids the filter selects among the rows created up to the watermark, written as numbered items, one statement) and
then acts on it batch by batch (:meth:`PostgresBulkStore.act`): lock the operation, act on each next item with the
same compare-and-swap statement the single-row endpoint runs (so the audit row is written by the change itself,
its actor naming the operation), record the outcomes and move the cursor — all in one transaction, so a runner
killed mid-batch leaves nothing half done and its successor acts on no id twice.

A dry run is the selection statement without an operation: the same count the run fixes.
SQL: ``sql/bulk.sql`` (and the single-row actions of ``jobs.sql``, ``executions.sql``, ``dependencies.sql``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, cast
from uuid import UUID

import asyncpg

from sundial_common.domain.ids import new_id
from sundial_common.stores import dependencies, executions, jobs, pools
from sundial_common.stores.database import Database
from sundial_common.stores.queries import load_file
from sundial_common.stores.types import Record, RetryDue

Q = load_file("bulk.sql")

#: Most ids one operation may select.
MAX_SELECTED = 1_000_000
#: Rows a dry run lists.
SAMPLE_SIZE = 20
#: What each target's operations may do.
ACTIONS: Mapping[str, tuple[str, ...]] = {
    "executions": ("redrive", "cancel"),
    "jobs": ("pause", "resume", "cancel", "trigger"),
}
#: An operation's states; the last three are final.
OPERATION_STATES = ("PREPARING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")


@dataclass(frozen=True, slots=True)
class Selection:
    """A validated filter: every field given must match. ``scheduled_*``/``finished_*`` are half-open ranges."""

    states: tuple[str, ...] | None = None
    pool: str | None = None
    handler: str | None = None
    labels: Mapping[str, str] | None = None
    name_prefix: str | None = None
    priority: str | None = None
    scheduled_from: datetime | None = None
    scheduled_to: datetime | None = None
    finished_from: datetime | None = None
    finished_to: datetime | None = None
    job_ids: tuple[UUID, ...] | None = None

    def as_json(self) -> dict[str, Any]:
        """The filter as stored with the operation (and shown back)."""
        out: dict[str, Any] = {}
        for name in self.__slots__:
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, datetime):
                value = value.astimezone(UTC).isoformat().replace("+00:00", "Z")
            elif name == "job_ids":
                value = [str(v) for v in value]
            elif isinstance(value, tuple):
                value = list(value)
            elif name == "labels":
                value = dict(value)
            out[name] = value
        return out

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Selection:
        values: dict[str, Any] = dict(stored)
        for name in ("scheduled_from", "scheduled_to", "finished_from", "finished_to"):
            if values.get(name) is not None:
                values[name] = datetime.fromisoformat(values[name])
        if values.get("states") is not None:
            values["states"] = tuple(values["states"])
        if values.get("job_ids") is not None:
            values["job_ids"] = tuple(UUID(v) for v in values["job_ids"])
        return cls(**values)


@dataclass(frozen=True, slots=True)
class NewOperation:
    tenant_id: str
    created_by: str
    target: str
    action: str
    selection: Selection
    rate_per_sec: int
    idempotency_key: str | None = None
    request_hash: bytes | None = None


@dataclass(frozen=True, slots=True)
class Preview:
    """What a filter selects now: the exact count and the first rows (by id)."""

    total: int
    sample: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Batch:
    """What one batch did: the operation after it (None: not RUNNING any more), the outcomes it recorded, and the
    retries it scheduled by shard (for the hot window: a re-drive's retries are due now)."""

    operation: Record | None
    outcomes: dict[str, int]
    retries: dict[int, list[RetryDue]] = field(default_factory=dict)


class BulkStore(Protocol):
    """Bulk operations and their items. ``tenant`` None means any tenant's (an admin's read)."""

    async def create(self, operation: NewOperation) -> tuple[Record, bool]: ...

    async def preview(self, tenant_id: str, target: str, action: str, selection: Selection) -> Preview: ...

    async def count_up_to(self, tenant_id: str, target: str, action: str, selection: Selection, most: int) -> int: ...

    async def by_key(self, tenant_id: str, idempotency_key: str) -> Record | None: ...

    async def get(self, operation_id: UUID, tenant: str | None) -> Record | None: ...

    async def list_operations(self, tenant: str | None, before: UUID | None, limit: int) -> list[Record]: ...

    async def items(self, operation_id: UUID, after: int, limit: int, outcome: str | None = None) -> list[Record]: ...

    async def cancel(self, operation_id: UUID, tenant: str | None) -> Record | None: ...

    async def active(self, limit: int) -> list[Record]: ...

    async def prepare(self, operation_id: UUID) -> Record | None: ...

    async def act(self, operation_id: UUID, limit: int) -> Batch: ...

    async def finish(self, operation_id: UUID, state: str, error: str | None = None) -> Record | None: ...

    async def resumed(self, operation_id: UUID) -> None: ...

    async def purge(self, days: float, limit: int) -> int: ...


def _selection_args(
    tenant_id: str, action: str, selection: Selection, watermark: datetime | None
) -> tuple[object, ...]:
    s = selection
    return (
        tenant_id,
        watermark,
        list(s.states) if s.states is not None else None,
        s.pool,
        s.handler,
        dict(s.labels) if s.labels else None,
        s.name_prefix,
        s.priority,
        s.scheduled_from,
        s.scheduled_to,
        s.finished_from,
        s.finished_to,
        list(s.job_ids) if s.job_ids is not None else None,
    )


def actor_of(operation: Record) -> str:
    """The audit actor of an operation's changes: it names the operation and who asked for it."""
    return f"bulk-operation {operation['id']} by {operation['created_by']}"


class PostgresBulkStore:
    """:class:`BulkStore` over the shared pool."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, operation: NewOperation) -> tuple[Record, bool]:
        """The new operation (PREPARING) and True; or, if the tenant already used the key, that one and False."""
        o = operation
        if o.action not in ACTIONS.get(o.target, ()):
            raise ValueError(f"{o.target} have no bulk action {o.action}")
        row = await self._db.pool.fetchrow(
            Q["insert_operation"],
            new_id(),
            o.tenant_id,
            o.created_by,
            o.target,
            o.action,
            o.selection.as_json(),
            o.rate_per_sec,
            o.idempotency_key,
            o.request_hash,
        )
        if row is not None:
            return cast(Record, row), True
        existing = await self._db.pool.fetchrow(Q["operation_by_key"], o.tenant_id, o.idempotency_key)
        assert existing is not None  # a key is kept as long as its operation
        return cast(Record, existing), False

    async def preview(self, tenant_id: str, target: str, action: str, selection: Selection) -> Preview:
        row = await self._db.pool.fetchrow(
            Q[f"select_{target}"],
            *_selection_args(tenant_id, action, selection, None),
            None,
            MAX_SELECTED,
            SAMPLE_SIZE,
            action,
            None,
        )
        assert row is not None
        return Preview(row["total"], list(row["sample"]))

    async def by_key(self, tenant_id: str, idempotency_key: str) -> Record | None:
        """The operation the tenant created under ``idempotency_key`` (None: none)."""
        return cast(Record | None, await self._db.pool.fetchrow(Q["operation_by_key"], tenant_id, idempotency_key))

    async def count_up_to(self, tenant_id: str, target: str, action: str, selection: Selection, most: int) -> int:
        """How many rows the selection has now, counted up to ``most`` (a count that stops there: ``most`` means
        at least that many)."""
        row = await self._db.pool.fetchrow(
            Q[f"select_{target}"], *_selection_args(tenant_id, action, selection, None), None, 0, 0, action, most
        )
        assert row is not None
        return int(row["total"])

    async def get(self, operation_id: UUID, tenant: str | None) -> Record | None:
        return cast(Record | None, await self._db.pool.fetchrow(Q["get_operation"], operation_id, tenant))

    async def list_operations(self, tenant: str | None, before: UUID | None, limit: int) -> list[Record]:
        return list(await self._db.pool.fetch(Q["list_operations"], tenant, before, limit))

    async def items(self, operation_id: UUID, after: int, limit: int, outcome: str | None = None) -> list[Record]:
        return list(await self._db.pool.fetch(Q["list_items"], operation_id, after, limit, outcome))

    async def cancel(self, operation_id: UUID, tenant: str | None) -> Record | None:
        """PREPARING → CANCELLED; RUNNING → cancel requested (the runner stops before its next batch). None: final."""
        return cast(Record | None, await self._db.pool.fetchrow(Q["cancel_operation"], operation_id, tenant))

    async def active(self, limit: int) -> list[Record]:
        return list(await self._db.pool.fetch(Q["active_operations"], limit))

    async def prepare(self, operation_id: UUID) -> Record | None:
        """Fix a PREPARING operation's selection: RUNNING with its items (SUCCEEDED when there are none, FAILED
        when there are more than :data:`MAX_SELECTED`). None: it was not PREPARING any more."""
        async with self._db.pool.acquire() as conn, conn.transaction():
            op = await conn.fetchrow(Q["lock_preparing"], operation_id)
            if op is None:
                return None
            if op["cancel_requested_at"] is not None:
                return cast(Record | None, await conn.fetchrow(Q["finish_operation"], operation_id, "CANCELLED", None))
            selection = Selection.from_json(_json(op["filter"]))
            fixed = await conn.fetchrow(
                Q[f"select_{op['target']}"],
                *_selection_args(op["tenant_id"], op["action"], selection, op["created_at"]),
                operation_id,
                MAX_SELECTED,
                0,
                op["action"],
                None,
            )
            assert fixed is not None
            if fixed["total"] > MAX_SELECTED:
                error = f"the filter selects {fixed['total']} rows, more than the {MAX_SELECTED} one operation may"
                return cast(Record | None, await conn.fetchrow(Q["finish_operation"], operation_id, "FAILED", error))
            return cast(Record | None, await conn.fetchrow(Q["start_operation"], operation_id, fixed["fixed"]))

    async def act(self, operation_id: UUID, limit: int) -> Batch:
        """Act on the next ``limit`` items of a RUNNING operation (see the module docstring). A cancel asked for
        meanwhile ends it CANCELLED instead. Executions are acted on a batch per statement; should that fail (one
        row's error), the batch is done again row by row, each in a savepoint, so the error fails that row only."""
        try:
            return await self._act(operation_id, limit, by_row=False)
        except asyncpg.PostgresError:
            return await self._act(operation_id, limit, by_row=True)

    async def _act(self, operation_id: UUID, limit: int, *, by_row: bool) -> Batch:
        async with self._db.pool.acquire() as conn, conn.transaction():
            op = await conn.fetchrow(Q["lock_running"], operation_id)
            if op is None:
                return Batch(None, {})
            if op["cancel_requested_at"] is not None:
                row = await conn.fetchrow(Q["finish_operation"], operation_id, "CANCELLED", None)
                return Batch(cast(Record | None, row), {})
            items = await conn.fetch(Q["next_items"], operation_id, op["cursor_seq"], limit)
            if not items:  # a total that no item reaches cannot happen; end it rather than spin
                row = await conn.fetchrow(Q["finish_operation"], operation_id, "FAILED", "no items left to act on")
                return Batch(cast(Record | None, row), {})
            ids = [item["target_id"] for item in items]
            retries: dict[int, list[RetryDue]] = {}
            if op["target"] == "executions" and not by_row:
                results = await _act_on_executions(conn, op, ids, retries)
            else:
                results = {}
                now = datetime.now(UTC)
                # A trigger's pool checks: the batch's jobs and their pools read once, not two reads an item.
                refusals = await _pool_refusals(conn, ids, op["tenant_id"]) if op["action"] == "trigger" else {}
                for target_id in ids:
                    try:
                        async with conn.transaction():  # a savepoint: one row's error fails that row only
                            results[target_id] = await _act_on(conn, op, target_id, now, refusals.get(target_id))
                    except asyncpg.PostgresError as exc:
                        results[target_id] = ("FAILED", f"{type(exc).__name__}: {exc}")
            outcomes = [results[i][0] for i in ids]
            counts: dict[str, int] = {}
            for outcome in outcomes:
                counts[outcome] = counts.get(outcome, 0) + 1
            row = await conn.fetchrow(
                Q["record_outcomes"], operation_id, [i["seq"] for i in items], outcomes, [results[i][1] for i in ids]
            )
            return Batch(cast(Record | None, row), counts, retries)

    async def finish(self, operation_id: UUID, state: str, error: str | None = None) -> Record | None:
        if state not in ("FAILED", "CANCELLED"):
            raise ValueError(f"an operation is ended FAILED or CANCELLED, not {state}")
        return cast(Record | None, await self._db.pool.fetchrow(Q["finish_operation"], operation_id, state, error))

    async def resumed(self, operation_id: UUID) -> None:
        await self._db.pool.execute(Q["resumed_operation"], operation_id)

    async def purge(self, days: float, limit: int) -> int:
        """Delete up to ``limit`` operations finished more than ``days`` ago (with their items)."""
        return int(await self._db.pool.fetchval(Q["purge_finished"], days, limit) or 0)


def _json(value: Any) -> Mapping[str, Any]:
    return cast(Mapping[str, Any], value)


async def _act_on_executions(
    conn: asyncpg.Connection, op: Record, ids: list[UUID], retries: dict[int, list[RetryDue]]
) -> dict[UUID, tuple[str, str | None]]:
    """A batch of executions in one statement: DONE, or SKIPPED with why (the row no longer matches). A re-drive's
    retries are added to ``retries`` by shard."""
    tenant, action = op["tenant_id"], op["action"]
    statement = Q["redrive_executions"] if action == "redrive" else Q["cancel_executions"]
    changed = await conn.fetch(statement, ids, tenant, actor_of(op), op["id"])
    results: dict[UUID, tuple[str, str | None]] = {}
    for row in changed:
        if action == "redrive":
            results[row["id"]] = ("DONE", f"attempt {row['attempt'] + 1} due now")
            retries.setdefault(row["shard"], []).append(RetryDue(row["id"], row["next_attempt_at"]))
        else:
            results[row["id"]] = (
                "DONE",
                "cancel requested from its worker" if row["state"] == "RUNNING" else "CANCELLED",
            )
    rest = [i for i in ids if i not in results]
    if rest:
        states = {r["id"]: r["state"] for r in await conn.fetch(Q["execution_states"], rest, tenant)}
        for i in rest:
            state = states.get(i)
            results[i] = (
                ("SKIPPED", "the execution no longer exists")
                if state is None
                else ("SKIPPED", f"is {state} now: nothing to {action}")
            )
    return results


async def _act_on(
    conn: asyncpg.Connection, op: Record, target_id: UUID, now: datetime, refusal: str | None = None
) -> tuple[str, str | None]:
    """One item: the action's compare-and-swap; DONE, or SKIPPED with why (the row no longer matches). ``refusal``:
    why a trigger may not send work to the job's pool (:func:`_pool_refusals`), which FAILS the item."""
    tenant, actor, action = op["tenant_id"], actor_of(op), op["action"]
    if op["target"] == "executions":
        if action == "redrive":
            row = await conn.fetchrow(executions.Q["retry_dead_execution"], target_id, tenant, actor)
            if row is None:
                row = await conn.fetchrow(Q["redrive_held_execution"], target_id, tenant, actor)
            if row is not None:
                return "DONE", f"attempt {row['attempt'] + 1} due now"
        else:
            row = await conn.fetchrow(executions.Q["cancel_execution"], target_id, tenant, actor)
            if row is not None:
                return "DONE", "cancel requested from its worker" if row["state"] == "RUNNING" else "CANCELLED"
        current = await conn.fetchrow(executions.Q["get_execution"], target_id, tenant)
        if current is None:
            return "SKIPPED", "the execution no longer exists"
        return "SKIPPED", f"is {current['state']} now: nothing to {action}"
    if action == "cancel":
        live = await conn.fetch(dependencies.Q["live_descendants"], target_id, 1)
        if live:
            return "SKIPPED", (
                f"{len(live)} DEPENDENT job(s) wait on it ({', '.join(str(r['id']) for r in live[:3])}): cancel them "
                "first, or this job alone with DELETE /v1/jobs/{id}?cascade=true"
            )
        row = await conn.fetchrow(jobs.Q["cancel_job"], target_id, tenant, actor)
    elif action == "pause":
        row = await conn.fetchrow(jobs.Q["pause_job"], target_id, tenant, actor)
    elif action == "resume":
        row = await conn.fetchrow(jobs.Q["resume_job"], target_id, tenant, actor)
    else:
        if refusal is not None:
            return "FAILED", refusal
        # A whole millisecond, clear of the whole seconds cron occurrences fall on ((job, scheduledFor) is unique).
        at = now.replace(microsecond=now.microsecond - now.microsecond % 1000)
        if at.microsecond == 0:
            at += timedelta(milliseconds=1)
        execution_id = new_id()
        row = await conn.fetchrow(jobs.Q["trigger_job"], target_id, tenant, at, execution_id, actor, None)
        if row is not None:
            return "DONE", f"execution {execution_id}"
    if row is not None:
        return "DONE", str(row["state"])
    current = await conn.fetchrow(jobs.Q["get_job"], target_id, tenant)
    if current is None:
        return "SKIPPED", "the job no longer exists"
    if action == "trigger" and current["trigger_at"] is not None:
        return "SKIPPED", "a manual run is already pending"
    return "SKIPPED", f"is {current['state']} now: nothing to {action}"


async def _pool_refusals(conn: asyncpg.Connection, job_ids: list[UUID], tenant: str) -> dict[UUID, str]:
    """Why a trigger of each of these jobs may not send new work to its pool (as a single trigger refuses it), for
    those it may not: the pool may have been unregistered, or given to another tenant, since the job was created.
    Two reads for the whole batch: its jobs' pools, then those pools. A job gone is not refused here: the trigger's
    compare-and-swap finds nothing and says so."""
    pool_of = {row["id"]: row["pool"] for row in await conn.fetch(Q["job_pools"], job_ids, tenant)}
    rows = await conn.fetch(Q["pools_named"], sorted(set(pool_of.values())))
    registered = {row["name"]: pools.Pool.from_row(row) for row in rows}
    refusals: dict[UUID, str] = {}
    for job_id, name in pool_of.items():
        refusal = _pool_refusal(name, registered.get(name), tenant)
        if refusal is not None:
            refusals[job_id] = refusal
    return refusals


def _pool_refusal(name: str, pool: pools.Pool | None, tenant: str) -> str | None:
    if pool is None:
        return f"pool `{name}` is not registered any more"
    if not pool.admits(tenant):
        return f"pool `{pool.name}` is not open to tenant {tenant}"
    if pool.staging:
        return f"pool `{pool.name}` is a staging pool: it runs replayed messages only"
    return None
