"""The replays store: replay requests and their lifecycle, per-partition progress, and staging runs.

A replay (``POST /v1/replays``) is a row in ``replays``; the replayer (``sundial replayer``) moves it
PENDING → RUNNING once its window is resolved to offsets (``replay_partitions``), commits each partition's
``next_offset`` with the counters after every published batch (:meth:`ReplayStore.commit_progress`, one
statement), and finishes it with a compare-and-swap. Staging workers record what they ran in ``replay_runs``
(:meth:`ReplayStore.record_runs`, one batch per poll). Nothing here reads or writes a production table.
SQL: ``sql/replays.sql``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, cast
from uuid import UUID

from sundial_common.domain.ids import new_id
from sundial_common.stores.database import Database
from sundial_common.stores.queries import load_file
from sundial_common.stores.types import Record

Q = load_file("replays.sql")

#: A replay's states; the last three are final.
REPLAY_STATES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")


@dataclass(frozen=True, slots=True)
class NewReplay:
    """What ``POST /v1/replays`` asks for, validated."""

    tenant_id: str
    created_by: str
    source_pool: str
    target_pool: str
    window_from: datetime
    window_to: datetime
    filter_handler: str | None = None
    filter_job_id: UUID | None = None
    filter_tenant_id: str | None = None
    rate_per_sec: int | None = None
    dry_run: bool = False
    idempotency_key: str | None = None  # unique per tenant: a retried create finds the replay it made
    request_hash: bytes | None = None  # tells a repeat of the request from another one reusing the key


@dataclass(frozen=True, slots=True)
class PartitionWindow:
    """A source partition's share of the window: offsets ``[start_offset, end_offset)``.

    ``end_offset`` None: the broker cannot look offsets up by time, so the end is found by reading (the first
    message stamped at or after the window's end, or the partition's end).
    """

    partition: int
    start_offset: int
    end_offset: int | None


@dataclass(frozen=True, slots=True)
class PartitionProgress:
    """What one batch did on one partition: read up to ``next_offset`` (exclusive) and the counts; the
    partition's ``end_offset`` if this batch found it."""

    partition: int
    next_offset: int
    scanned: int
    matched: int
    published: int
    end_offset: int | None = None


@dataclass(frozen=True, slots=True)
class ReplayRun:
    """A staging worker's run of one replayed message."""

    replay_id: UUID
    source_partition: int
    source_offset: int
    original_execution_id: UUID
    handler: str
    outcome: str  # SUCCEEDED | FAILED | TIMED_OUT
    error: str | None
    duration_ms: float
    worker_id: str


class ReplayStore(Protocol):
    """Replays, their progress and their staging runs. ``tenant`` None means any tenant's (an admin)."""

    async def insert_replay(self, replay: NewReplay) -> tuple[Record, bool]:
        """The new replay and True; or, if the tenant already used ``idempotency_key``, that replay and False."""
        ...

    async def get_replay(self, replay_id: UUID, tenant: str | None) -> Record | None: ...

    async def list_replays(self, tenant: str | None, before: UUID | None, limit: int) -> list[Record]: ...

    async def replay_partitions(self, replay_ids: Sequence[UUID]) -> list[Record]: ...

    async def cancel_replay(self, replay_id: UUID, tenant: str | None) -> Record | None: ...

    async def active_replays(self, limit: int) -> list[Record]: ...

    async def start_replay(self, replay_id: UUID, partitions: Sequence[PartitionWindow]) -> bool: ...

    async def resumed_replay(self, replay_id: UUID) -> None: ...

    async def commit_progress(self, replay_id: UUID, progress: Sequence[PartitionProgress]) -> bool | None: ...

    async def finish_replay(self, replay_id: UUID, state: str, error: str | None = None) -> Record | None: ...

    async def record_runs(self, runs: Sequence[ReplayRun]) -> None: ...

    async def list_runs(self, replay_id: UUID, after: tuple[int, int] | None, limit: int) -> list[Record]: ...


class PostgresReplayStore:
    """:class:`ReplayStore` over the shared pool."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def insert_replay(self, replay: NewReplay) -> tuple[Record, bool]:
        row = await self._db.pool.fetchrow(
            Q["insert_replay"],
            new_id(),
            replay.tenant_id,
            replay.created_by,
            replay.source_pool,
            replay.target_pool,
            replay.window_from,
            replay.window_to,
            replay.filter_handler,
            replay.filter_job_id,
            replay.filter_tenant_id,
            replay.rate_per_sec,
            replay.dry_run,
            replay.idempotency_key,
            replay.request_hash,
        )
        if row is not None:
            return cast(Record, row), True
        existing = await self._db.pool.fetchrow(Q["replay_by_key"], replay.tenant_id, replay.idempotency_key)
        assert existing is not None  # keys are never deleted while their replay exists
        return cast(Record, existing), False

    async def get_replay(self, replay_id: UUID, tenant: str | None) -> Record | None:
        return cast(Record | None, await self._db.pool.fetchrow(Q["get_replay"], replay_id, tenant))

    async def list_replays(self, tenant: str | None, before: UUID | None, limit: int) -> list[Record]:
        return list(await self._db.pool.fetch(Q["list_replays"], tenant, before, limit))

    async def replay_partitions(self, replay_ids: Sequence[UUID]) -> list[Record]:
        return list(await self._db.pool.fetch(Q["replay_partitions"], list(replay_ids)))

    async def cancel_replay(self, replay_id: UUID, tenant: str | None) -> Record | None:
        return cast(Record | None, await self._db.pool.fetchrow(Q["cancel_replay"], replay_id, tenant))

    async def active_replays(self, limit: int) -> list[Record]:
        return list(await self._db.pool.fetch(Q["active_replays"], limit))

    async def start_replay(self, replay_id: UUID, partitions: Sequence[PartitionWindow]) -> bool:
        """PENDING → RUNNING with its partitions' offsets; False if it was not PENDING any more (cancelled)."""
        row = await self._db.pool.fetchrow(
            Q["start_replay"],
            replay_id,
            [p.partition for p in partitions],
            [p.start_offset for p in partitions],
            [p.end_offset for p in partitions],
        )
        return bool(row and row["started"])

    async def resumed_replay(self, replay_id: UUID) -> None:
        await self._db.pool.execute(Q["resumed_replay"], replay_id)

    async def commit_progress(self, replay_id: UUID, progress: Sequence[PartitionProgress]) -> bool | None:
        """Record a batch's progress; whether a cancel was asked for (None: the replay is not RUNNING any more)."""
        value = await self._db.pool.fetchval(
            Q["commit_progress"],
            replay_id,
            [p.partition for p in progress],
            [p.next_offset for p in progress],
            [p.scanned for p in progress],
            [p.matched for p in progress],
            [p.published for p in progress],
            [p.end_offset for p in progress],
        )
        return None if value is None else bool(value)

    async def finish_replay(self, replay_id: UUID, state: str, error: str | None = None) -> Record | None:
        if state not in REPLAY_STATES[2:]:
            raise ValueError(f"a replay finishes SUCCEEDED, FAILED or CANCELLED, not {state}")
        return cast(Record | None, await self._db.pool.fetchrow(Q["finish_replay"], replay_id, state, error))

    async def record_runs(self, runs: Sequence[ReplayRun]) -> None:
        if not runs:
            return
        await self._db.pool.execute(
            Q["record_runs"],
            [r.replay_id for r in runs],
            [r.source_partition for r in runs],
            [r.source_offset for r in runs],
            [r.original_execution_id for r in runs],
            [r.handler for r in runs],
            [r.outcome for r in runs],
            [r.error for r in runs],
            [r.duration_ms for r in runs],
            [r.worker_id for r in runs],
        )

    async def list_runs(self, replay_id: UUID, after: tuple[int, int] | None, limit: int) -> list[Record]:
        partition, offset = after if after is not None else (-1, -1)
        return list(await self._db.pool.fetch(Q["list_runs"], replay_id, partition, offset, limit))
