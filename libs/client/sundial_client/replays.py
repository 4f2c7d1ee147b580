"""Replays from the client: the shapes of ``/v1/replays`` and ``client.replays`` (create, get, list, cancel, runs).

``client.replays.create(source_pool=…, window_from=…, window_to=…, target_pool=…)`` asks for a replay of a
window of a pool's Kafka messages into a staging pool; ``watch`` follows it until it ends.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, Protocol, TypeVar

from pydantic import Field

from sundial_client.calls import MAX_PAGE, Call, _id, _model, instant
from sundial_client.models import _Wire

T = TypeVar("T")


class Caller(Protocol):
    """What a namespace needs of its client: a call made (with the client's retries), and its sleep."""

    sleep: Callable[[float], None]

    def call(self, call: Call[T]) -> T: ...


class ReplayState(enum.StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


FINAL_STATES = frozenset({ReplayState.SUCCEEDED, ReplayState.FAILED, ReplayState.CANCELLED})


class ReplayFilter(_Wire):
    handler: str | None = None
    job_id: str | None = None
    tenant_id: str | None = None


class ReplayPartition(_Wire):
    partition: int
    start_offset: int
    end_offset: int | None
    next_offset: int
    scanned: int
    matched: int
    published: int


class Replay(_Wire):
    replay_id: str
    state: ReplayState
    source_pool: str
    target_pool: str
    window_from: datetime = Field(alias="from")
    window_to: datetime = Field(alias="to")
    filter: ReplayFilter
    rate_per_sec: int | None
    dry_run: bool
    scanned: int
    matched: int
    published: int
    duplicates: int | None = None
    resumes: int = 0
    partitions: list[ReplayPartition]
    created_by: str
    cancel_requested_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None

    @property
    def ended(self) -> bool:
        return self.state in FINAL_STATES


class ReplayPage(_Wire):
    items: list[Replay]
    next_cursor: str | None


class ReplayRun(_Wire):
    original_execution_id: str
    source_partition: int
    source_offset: int
    handler: str
    outcome: str
    error: str | None
    duration_ms: float
    worker_id: str
    deliveries: int
    recorded_at: datetime


class ReplayRunPage(_Wire):
    items: list[ReplayRun]
    next_cursor: str | None


# --- calls ----------------------------------------------------------------------------------------


def create_replay(
    *,
    source_pool: str,
    window_from: datetime,
    window_to: datetime,
    target_pool: str,
    handler: str | None = None,
    job_id: str | None = None,
    tenant_id: str | None = None,
    rate_per_sec: int | None = None,
    dry_run: bool = False,
) -> Call[Replay]:
    found = {"handler": handler, "jobId": job_id, "tenantId": tenant_id}
    body: dict[str, Any] = {
        "sourcePool": source_pool,
        "from": instant(window_from),
        "to": instant(window_to),
        "targetPool": target_pool,
        "filter": {k: v for k, v in found.items() if v is not None},
        "dryRun": dry_run,
    }
    if rate_per_sec is not None:
        body["ratePerSec"] = rate_per_sec
    return Call("POST", "/v1/replays", _model(Replay), body=body, idempotent_create=True)


def get_replay(replay_id: str) -> Call[Replay]:
    return Call("GET", f"/v1/replays/{_id(replay_id)}", _model(Replay))


def list_replays(*, cursor: str | None, limit: int) -> Call[ReplayPage]:
    params: dict[str, Any] = {"limit": limit} | ({"cursor": cursor} if cursor else {})
    return Call("GET", "/v1/replays", _model(ReplayPage), params=params)


def cancel_replay(replay_id: str) -> Call[Replay]:
    return Call("POST", f"/v1/replays/{_id(replay_id)}/cancel", _model(Replay))


def replay_runs(replay_id: str, *, cursor: str | None, limit: int) -> Call[ReplayRunPage]:
    params: dict[str, Any] = {"limit": limit} | ({"cursor": cursor} if cursor else {})
    return Call("GET", f"/v1/replays/{_id(replay_id)}/runs", _model(ReplayRunPage), params=params)


# --- the synchronous namespace --------------------------------------------------------------------


class Replays:
    """``client.replays``."""

    def __init__(self, client: Caller) -> None:
        self._c = client

    def create(self, **fields: Any) -> Replay:
        """Ask for a replay (see :func:`create_replay` for the fields); it starts PENDING."""
        return self._c.call(create_replay(**fields))

    def get(self, replay_id: str) -> Replay:
        return self._c.call(get_replay(replay_id))

    def cancel(self, replay_id: str) -> Replay:
        """PENDING: CANCELLED at once; RUNNING: stops at its next batch."""
        return self._c.call(cancel_replay(replay_id))

    def list(self, *, page_size: int = 50) -> Iterator[Replay]:
        cursor: str | None = None
        while True:
            page = self._c.call(list_replays(cursor=cursor, limit=min(page_size, MAX_PAGE)))
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def runs(self, replay_id: str, *, page_size: int = 200) -> Iterator[ReplayRun]:
        cursor: str | None = None
        while True:
            page = self._c.call(replay_runs(replay_id, cursor=cursor, limit=min(page_size, 1000)))
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def watch(self, replay_id: str, *, poll_sec: float = 1.0) -> Iterator[Replay]:
        """The replay now, then every ``poll_sec`` until it has ended."""
        while True:
            current = self.get(replay_id)
            yield current
            if current.ended:
                return
            self._c.sleep(poll_sec)
