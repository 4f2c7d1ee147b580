"""Worker incarnations: a restarted worker declares what its previous incarnation left running lost, at once.

A worker's identity (``SUNDIAL_WORKER_ID``, else ``SUNDIAL_INSTANCE_ID``: the process name under the
supervisor, the container's hostname and pid in a container) outlives its process. When a process with that
identity starts, :meth:`Incarnations.begin` takes the identity's next incarnation in Postgres
(``worker_incarnations``) before the consumer joins the pool: every attempt still RUNNING under that
identity and started before that moment belonged to an earlier incarnation, whose handlers died with it.
They are ended as the sweeper ends a lost worker's attempts — ``FAILED_WORKER_LOST``, compare-and-swap on the
attempt and the worker, the retry scheduled with the job's backoff (or DEAD after the last attempt) and put
straight into its shard's hot window — but within a second of the restart, instead of after their liveness
keys expired and stayed missing (heartbeat TTL + the sweeper's confirmation). A worker that never comes back
is still the sweeper's.

Two live processes must not share an identity: the second would take the first's running attempts for
lost. Nothing is lost or doubled even then (the first one's late outcomes lose their compare-and-swap), but
each of those attempts runs again.

A one-shot step of the runtime's start, not a loop; a database that does not answer does not stop the
worker from starting (the sweeper finds those attempts anyway).
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sundial_common.domain.retry_policy import RetryPolicy
from sundial_common.hotwindow.window import HotWindow
from sundial_common.observability.metrics import AttemptsEnded
from sundial_common.stores import Stores
from sundial_common.stores.executions import LostAttempt
from sundial_common.stores.workers import Incarnation

from sundial_worker.errors import REDIS_ERRORS, TRANSIENT_DB_ERRORS

log = logging.getLogger("sundial.worker")

_PAGE = 1000
# Retries due a little past the hot window go in too (the flusher's margin, for the same reason).
_HOT_WINDOW_MARGIN = timedelta(seconds=60)


@dataclass(frozen=True, slots=True)
class IncarnationResult:
    incarnation: Incarnation | None
    """None if Postgres did not answer (the worker starts anyway)."""
    lost: int = 0
    """Attempts of earlier incarnations declared FAILED_WORKER_LOST (or DEAD, CANCELLED where that applies)."""
    retries_scheduled: int = 0


class Incarnations:
    """Takes this worker's next incarnation and ends the attempts its earlier incarnations left RUNNING."""

    def __init__(
        self, stores: Stores, hot_window: HotWindow, worker_id: str, pool: str, *, hot_window_sec: int
    ) -> None:
        self.worker_id = worker_id
        self.pool = pool
        self._stores = stores
        self._hot_window = hot_window
        self._hot_window_sec = hot_window_sec
        self._ended = AttemptsEnded()

    async def begin(self) -> IncarnationResult:
        try:
            incarnation = await self._stores.workers.begin_incarnation(
                self.worker_id, self.pool, socket.gethostname(), os.getpid()
            )
            lost, retries = await self._end_orphans(incarnation)
        except TRANSIENT_DB_ERRORS as exc:
            log.warning(
                "could not take this worker's incarnation (the sweeper recovers what an earlier one left): %s", exc
            )
            return IncarnationResult(None)
        if lost:
            log.warning(
                "worker %s incarnation %d: declared %d attempts of an earlier incarnation lost (%d retries scheduled)",
                self.worker_id,
                incarnation.number,
                lost,
                retries,
            )
        else:
            log.info("worker %s incarnation %d", self.worker_id, incarnation.number)
        return IncarnationResult(incarnation, lost, retries)

    async def _end_orphans(self, incarnation: Incarnation) -> tuple[int, int]:
        lost = retries = 0
        while True:
            rows = await self._stores.workers.orphaned_attempts(incarnation, _PAGE)
            attempts = [
                LostAttempt(
                    execution_id=row["id"],
                    attempt=row["attempt"],
                    worker_id=row["worker_id"],
                    state="FAILED_WORKER_LOST",
                    error=f"WorkerLost: worker {self.worker_id} restarted (incarnation {incarnation.number}) "
                    "while the attempt ran",
                    retry_delay_ms=RetryPolicy.from_json(row["retry_policy"]).delay_ms(row["attempt"]),
                )
                for row in rows
            ]
            ended = await self._stores.executions.fail_running(f"worker:{self.worker_id}", attempts)
            self._ended.record((f.tenant_id, f.pool, f.state, f.next_attempt_at is not None) for f in ended)
            horizon = datetime.now(UTC) + timedelta(seconds=self._hot_window_sec) + _HOT_WINDOW_MARGIN
            try:
                await self._hot_window.add_retries_due(ended, horizon)
            except REDIS_ERRORS as exc:
                log.warning("could not add retries to the hot window (the hydrator will): %s", exc)
            lost += len(ended)
            retries += sum(1 for f in ended if f.retry is not None)
            # A page whose rows all moved on meanwhile (ended elsewhere) would come back again: stop there.
            if len(rows) < _PAGE or not ended:
                return lost, retries
