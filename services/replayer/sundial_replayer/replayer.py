"""The replayer: moves replays PENDING → RUNNING → SUCCEEDED, re-publishing their window into a staging pool.

Each pass (``run_once``) takes the unfinished replays in creation order and gives each a turn of at most
``slice_sec``:

1. **Start** (PENDING): create the target topic, resolve the window to offsets per partition
   (:meth:`~sundial_common.broker.topic_windows.TopicInspector.resolve_window`: offsets for ``from`` and ``to``), and
   compare-and-swap the replay to RUNNING with them.
2. **Copy** (RUNNING): read each unfinished partition from its ``next_offset`` in batches; a message counts
   as *scanned*, is *matched* when its broker timestamp lies in ``[from, to)`` and the filter (handler, job,
   tenant) selects it, and is re-published to the target pool's topic with its key, value and headers plus
   ``sundial-replay-{id,execution-id,topic,partition,offset,timestamp}``. Once the broker acknowledged the
   batch, one statement commits each partition's ``next_offset`` and the counters: a replayer killed at
   any moment resumes from there and publishes at most its last batch again (at-least-once into staging;
   the staging workers count the duplicates). That statement also says whether a cancel was asked for.
   Where the broker cannot look offsets up by time the end of a partition is found by reading: its first
   message stamped at or after ``to``, or its end.
3. **Finish**: every partition at its end offset → SUCCEEDED; a cancel → CANCELLED; a source topic that is
   gone or a publish that keeps failing → FAILED with the error.

``ratePerSec`` paces publishing: batches of a tenth of a second's worth, each sent when the running total
allows it, so the rate holds over any stretch longer than that (a replay that waited for its turn does not
burst to catch up). Nothing here reads or writes a production table or consumer group: the source is read
by assignment, and the only rows written are the replay's own.

One replayer is active at a time (elected like the sweeper, :mod:`sundial_common.coordination.singleton`); a standby
takes
over a RUNNING replay where its progress stands (``resumes`` counts it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import orjson
from sundial_common.broker.messages import pool_topic
from sundial_common.broker.topic_windows import REPLAY_HEADER_PREFIX, TopicInspector
from sundial_common.runtime.clock import to_ms
from sundial_common.runtime.pacing import Pacer
from sundial_common.stores import Stores
from sundial_common.stores.replays import PartitionProgress

from sundial_replayer.kafka import OutRecord, ReplayKafka, SourceMessage

log = logging.getLogger("sundial.replayer")


@dataclass(frozen=True)
class ReplayerConfig:
    #: Seconds between passes while there is nothing to replay...
    interval_sec: float = 0.5
    #: ...doubling up to this (never below ``interval_sec``) while passes keep finding nothing (see
    #: ``service.every``): a replay asked for after a quiet spell starts within this.
    idle_interval_sec: float = 4.0
    #: Most messages read (and re-published) per batch; a progress commit follows each batch.
    batch_size: int = 5000
    #: Longest turn of one replay in a pass, so several replays share the replayer and a pass ends.
    slice_sec: float = 5.0
    #: How long one read waits for a first message.
    poll_timeout_sec: float = 0.2
    #: Most unfinished replays looked at per pass.
    max_active: int = 32

    def __post_init__(self) -> None:
        for name in ("interval_sec", "idle_interval_sec", "slice_sec", "poll_timeout_sec"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ReplayerConfig.{name} must be > 0")
        for name in ("batch_size", "max_active"):
            if getattr(self, name) < 1:
                raise ValueError(f"ReplayerConfig.{name} must be >= 1")


@dataclass
class ReplayPassResult:
    #: Unfinished replays seen (a pass with any goes again at once).
    active: int = 0
    started: int = 0
    resumed: int = 0
    batches: int = 0
    scanned: int = 0
    matched: int = 0
    published: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0


@dataclass
class _Partition:
    next_offset: int
    end_offset: int | None
    scanned: int = 0
    matched: int = 0
    published: int = 0
    found_end: int | None = None

    @property
    def done(self) -> bool:
        return self.end_offset is not None and self.next_offset >= self.end_offset


@dataclass
class _Filter:
    window_from_ms: int
    window_to_ms: int
    handler: str | None
    job_id: str | None
    tenant_id: str | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> _Filter:
        return cls(
            to_ms(row["window_from"]),
            to_ms(row["window_to"]),
            row["filter_handler"],
            str(row["filter_job_id"]) if row["filter_job_id"] else None,
            row["filter_tenant_id"],
        )

    def selects(self, body: Mapping[str, Any]) -> bool:
        return (
            (self.handler is None or body.get("handler") == self.handler)
            and (self.job_id is None or body.get("job_id") == self.job_id)
            and (self.tenant_id is None or body.get("tenant_id") == self.tenant_id)
        )


class Replayer:
    """Runs replays; safe to drive one pass at a time (``run_once``) from tests."""

    def __init__(
        self, stores: Stores, kafka: ReplayKafka, topics: TopicInspector, config: ReplayerConfig | None = None
    ) -> None:
        self.config = config or ReplayerConfig()
        self._stores = stores
        self._kafka = kafka
        self._topics = topics
        #: Replays this process has run: a RUNNING replay not in here was left by another replayer.
        self._held: set[UUID] = set()
        self._pacers: dict[UUID, Pacer] = {}

    async def run_once(self) -> ReplayPassResult:
        result = ReplayPassResult()
        rows = await self._stores.replays.active_replays(self.config.max_active)
        result.active = len(rows)
        for row in rows:
            try:
                await self._advance(row, result)
            except Exception as exc:  # one broken replay must not stall the others; it is FAILED, with why
                log.exception("replay %s failed", row["id"])
                if await self._stores.replays.finish_replay(row["id"], "FAILED", f"{type(exc).__name__}: {exc}"):
                    result.failed += 1
                self._forget(row["id"])
        return result

    def _forget(self, replay_id: UUID) -> None:
        self._held.discard(replay_id)
        self._pacers.pop(replay_id, None)

    async def _finish(self, replay_id: UUID, state: str, result: ReplayPassResult, error: str | None = None) -> None:
        if await self._stores.replays.finish_replay(replay_id, state, error) is not None:
            setattr(result, state.lower(), getattr(result, state.lower()) + 1)
            log.info("replay %s %s%s", replay_id, state, f": {error}" if error else "")
        self._forget(replay_id)

    async def _advance(self, row: Mapping[str, Any], result: ReplayPassResult) -> None:
        replay_id: UUID = row["id"]
        store = self._stores.replays
        if row["state"] == "RUNNING" and row["cancel_requested_at"] is not None:
            await self._finish(replay_id, "CANCELLED", result)
            return
        source = pool_topic(row["source_pool"])
        if row["state"] == "PENDING":
            if not row["dry_run"]:
                await self._kafka.ensure_topic(pool_topic(row["target_pool"]))
            try:
                windows = await self._topics.resolve_window(source, row["window_from"], row["window_to"])
            except LookupError as exc:
                await self._finish(replay_id, "FAILED", result, str(exc))
                return
            if not await store.start_replay(replay_id, windows):
                return  # cancelled meanwhile
            result.started += 1
            self._held.add(replay_id)
            log.info("replay %s started: %s [%s, %s)", replay_id, source, row["window_from"], row["window_to"])
        elif replay_id not in self._held:
            await store.resumed_replay(replay_id)
            self._held.add(replay_id)
            result.resumed += 1
            log.info("replay %s resumed", replay_id)
        parts = {
            p["partition"]: _Partition(p["next_offset"], p["end_offset"])
            for p in await store.replay_partitions([replay_id])
        }
        await self._copy(row, source, parts, result)

    async def _copy(
        self, row: Mapping[str, Any], source: str, parts: dict[int, _Partition], result: ReplayPassResult
    ) -> None:
        replay_id: UUID = row["id"]
        target = pool_topic(row["target_pool"])
        wanted = _Filter.of(row)
        dry_run: bool = row["dry_run"]
        pacer = None
        if row["rate_per_sec"]:
            pacer = self._pacers.setdefault(replay_id, Pacer(row["rate_per_sec"]))
        batch_size = min(self.config.batch_size, pacer.chunk()) if pacer else self.config.batch_size
        replay_header = str(replay_id).encode()
        source_header = source.encode()
        deadline = time.monotonic() + self.config.slice_sec
        while True:
            open_parts = {p: s.next_offset for p, s in parts.items() if not s.done}
            if not open_parts:
                await self._finish(replay_id, "SUCCEEDED", result)
                return
            if time.monotonic() >= deadline:
                return
            batch = await self._kafka.read(source, open_parts, batch_size, self.config.poll_timeout_sec)
            out: list[OutRecord] = []
            for message in batch.messages:
                part = parts.get(message.partition)
                if part is None or part.done or message.offset < part.next_offset:
                    continue  # another partition's, past its end, or read twice after a re-assignment
                if part.end_offset is None and message.timestamp_ms >= wanted.window_to_ms:
                    part.end_offset = part.found_end = message.offset  # the end of the window on this partition
                    continue
                part.next_offset = message.offset + 1
                part.scanned += 1
                if not wanted.window_from_ms <= message.timestamp_ms < wanted.window_to_ms:
                    continue
                body = _body(message)
                if body is None or not wanted.selects(body):
                    continue
                part.matched += 1
                if not dry_run:
                    out.append(_replayed(message, body, replay_header, source_header))
                    part.published += 1
            for partition, end in batch.ends.items():
                part = parts.get(partition)
                if part is not None and part.end_offset is None and end >= part.next_offset:
                    part.end_offset = part.found_end = part.next_offset = end
            if not any(s.scanned or s.found_end is not None for s in parts.values()):
                continue  # nothing read yet (fetch still on its way)
            if pacer is not None and out:
                await pacer.wait(len(out))
            await self._kafka.publish(target, out)
            progress = [
                PartitionProgress(p, s.next_offset, s.scanned, s.matched, s.published, s.found_end)
                for p, s in parts.items()
                if s.scanned or s.found_end is not None
            ]
            result.batches += 1
            result.scanned += sum(p.scanned for p in progress)
            result.matched += sum(p.matched for p in progress)
            result.published += sum(p.published for p in progress)
            for s in parts.values():
                s.scanned = s.matched = s.published = 0
                s.found_end = None
            cancel = await self._stores.replays.commit_progress(replay_id, progress)
            if cancel is None:  # finished elsewhere (a cancel of a PENDING replay cannot reach here)
                self._forget(replay_id)
                return
            if cancel:
                await self._finish(replay_id, "CANCELLED", result)
                return


def _body(message: SourceMessage) -> dict[str, Any] | None:
    if message.value is None:
        return None
    try:
        body = orjson.loads(message.value)
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


def _replayed(message: SourceMessage, body: Mapping[str, Any], replay: bytes, topic: bytes) -> OutRecord:
    prefix = REPLAY_HEADER_PREFIX
    headers = message.headers
    if any(name.startswith(prefix) for name, _ in headers):
        headers = [h for h in headers if not h[0].startswith(prefix)]  # a replay of a replay names the latest only
    return OutRecord(
        message.key,
        message.value,
        [
            *headers,
            (_ID, replay),
            (_EXECUTION_ID, str(body.get("execution_id", "")).encode()),
            (_TOPIC, topic),
            (_PARTITION, b"%d" % message.partition),
            (_OFFSET, b"%d" % message.offset),
            (_TIMESTAMP, b"%d" % message.timestamp_ms),
        ],
    )


_ID, _EXECUTION_ID, _TOPIC, _PARTITION, _OFFSET, _TIMESTAMP = (
    REPLAY_HEADER_PREFIX + name for name in ("id", "execution-id", "topic", "partition", "offset", "timestamp")
)
