"""The ``backfill.finished``, ``replay.finished`` and ``bulk.finished`` incidents: a long operation is over.

Nobody on the operations' own paths records them: a backfill is walked by a dispatcher's shard leader, a replay by
the replayer, a bulk operation by an API replica's runner, and none of those should wait on notifications. The
sweeper reads them instead, each pass (:class:`FinishedOperations`): the operations of the subscribed tenants that
finished in the last ``lookback_sec`` and have no incident yet
(:meth:`~sundial_common.stores.notifications.NotificationStore.finished_operations`). A backfill is finished when
its range is walked (or it was cancelled) **and** every execution it made has ended, so its counts are the
outcomes a user waits for (succeeded, dead, cancelled); a replay carries what it scanned, matched and published
and its staging runs' outcomes; a bulk operation its items done, skipped and failed. The incident is keyed by
the event and the operation's id: one incident per operation, however many passes or sweepers see it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from sundial_common.stores.notifications import Incident, NotificationStore
from sundial_common.stores.types import Record


@dataclass(frozen=True)
class FinishedOperationsConfig:
    """``interval_sec``: between passes; ``lookback_sec``: how long after it finished an operation is still told
    (a sweeper down longer loses those); ``batch``: operations of each kind read per pass."""

    interval_sec: float = 15.0
    lookback_sec: float = 86_400.0
    batch: int = 200

    def __post_init__(self) -> None:
        if self.interval_sec <= 0 or self.lookback_sec <= 0 or self.batch < 1:
            raise ValueError("interval_sec and lookback_sec must be > 0 and batch >= 1")


def finished_incidents(rows: Iterable[Record]) -> list[Incident]:
    """One incident per finished operation, its counts in ``detail``."""
    incidents = []
    for row in rows:
        counts: Any = row["counts"]
        if isinstance(counts, str | bytes):
            counts = orjson.loads(counts)
        event = row["event"]
        incidents.append(
            Incident(
                tenant_id=row["tenant_id"],
                event=event,
                incident_key=f"{event}:{row['id']}",
                pool=row["pool"],
                job_id=str(row["job_id"]) if row["job_id"] else None,
                detail={
                    "operationId": str(row["id"]),
                    "state": row["state"],
                    "finishedAt": row["finished_at"].isoformat(),
                    "error": row["error"],
                    **(counts or {}),
                },
            )
        )
    return incidents


class FinishedOperations:
    """Records the finished operations' incidents (one pass: :meth:`run_once`, answering how many are new)."""

    def __init__(self, store: NotificationStore, config: FinishedOperationsConfig) -> None:
        self.store = store
        self.config = config

    async def run_once(self) -> int:
        rows = await self.store.finished_operations(self.config.lookback_sec, self.config.batch)
        if not rows:
            return 0
        return (await self.store.record_incidents(finished_incidents(rows)))[0]
