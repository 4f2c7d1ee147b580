"""The incidents the sweeper notices for notification subscriptions: an execution that went DEAD, a retry
breaker that opened or closed, an occurrence that did not start in time.

The sweeper already reads every DEAD execution once, from the dead-letter outbox, before it publishes the
dead letter and marks the row; it records the incidents of those rows first
(:meth:`~sundial_common.stores.notifications.NotificationStore.record_incidents`). A pass that dies between
the two reads the same rows again, and their incidents, keyed ``execution.dead:<execution id>``, are already
there: one incident per execution, whichever sweeper replica recorded it. The incident carries no tenant data
the sweeper could not read in the clear: the error's class, never its (sealed) message.

A breaker's incidents (**opened** when it leaves CLOSED, **closed** when it comes back) are recorded by the
breaker store in the transaction of the move itself
(:func:`~sundial_common.stores.breakers.breaker_incident`), whoever moved it: the sweeper's loop or an operator.

**Late starts** are found by the database's clock, not reported by anyone: :class:`LateStarts` looks, each pass,
for occurrences not started a grace after they were due — a job whose fire time passed with no execution made
(every dispatcher down), or a first attempt still PENDING (no worker to start it) — of the tenants that subscribed
to ``execution.late``. One occurrence (job, nominal time) is one incident, whichever of the two saw it first.

**Outcome changes** are a job's state changes, not its every failure: :class:`OutcomeChanges` looks, each pass,
at every job of the tenants that subscribed to ``execution.failing`` or ``execution.recovered``, at its latest
finished occurrence (SUCCEEDED or DEAD, by nominal time) and the one before it. A DEAD after a SUCCEEDED is
``execution.failing``, a SUCCEEDED after a DEAD ``execution.recovered``; the incident is keyed by the event and
the execution that made the change, so each change is one incident, however many passes or sweepers see it.
A job with no success yet is not "failing" (``execution.dead`` tells each of its deaths), and a change
overtaken within one pass (a failure and the recovery after it between two passes) is told by its last half.

**Retention**: :class:`IncidentRetention` deletes incidents older than ``keep_days`` whose deliveries are over,
with their deliveries (the delivery logs keep that long).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from uuid import UUID

from sundial_common.runtime.clock import to_ms
from sundial_common.stores.notifications import Incident, NotificationStore
from sundial_common.stores.types import Record

DEAD = "execution.dead"
LATE = "execution.late"
FAILING = "execution.failing"
RECOVERED = "execution.recovered"
#: The outcomes of a finished occurrence, and the change event from the other one.
CHANGE_TO = {"DEAD": FAILING, "SUCCEEDED": RECOVERED}
FIRST_JOB = UUID(int=0)


def dead_incidents(rows: Iterable[Record]) -> list[Incident]:
    """One ``execution.dead`` incident per row of the dead-letter outbox."""
    incidents = []
    for row in rows:
        error = row["error"]
        finished = row["finished_at"]
        incidents.append(
            Incident(
                tenant_id=row["tenant_id"],
                event=DEAD,
                incident_key=f"{DEAD}:{row['id']}",
                pool=row["pool"],
                job_id=str(row["job_id"]),
                execution_id=str(row["id"]),
                detail={
                    "jobName": row["job_name"],
                    "handler": row["handler"],
                    "attempt": row["attempt"],
                    "maxAttempts": row["max_attempts"],
                    "scheduledFor": row["scheduled_for"].isoformat(),
                    "finishedAt": finished.isoformat() if finished else None,
                    "errorClass": error.split(":", 1)[0] if error else None,
                },
            )
        )
    return incidents


@dataclass(frozen=True)
class LateStartsConfig:
    """``grace_sec``: how long after its due time an occurrence may wait to start; ``interval_sec``: between
    passes; ``batch``: occurrences looked at per pass (of each kind)."""

    grace_sec: float = 300.0
    interval_sec: float = 15.0
    batch: int = 500

    def __post_init__(self) -> None:
        if self.grace_sec < 0 or self.interval_sec <= 0 or self.batch < 1:
            raise ValueError("grace_sec must be >= 0, interval_sec > 0 and batch >= 1")


@dataclass(frozen=True)
class LateStartsPass:
    late: int = 0
    incidents: int = 0


def late_incidents(rows: Iterable[Record]) -> list[Incident]:
    """One ``execution.late`` incident per occurrence (job and nominal time)."""
    found: dict[str, Incident] = {}
    for row in rows:
        key = f"{LATE}:{row['job_id']}:{to_ms(row['due_for'])}"
        found.setdefault(
            key,
            Incident(
                tenant_id=row["tenant_id"],
                event=LATE,
                incident_key=key,
                pool=row["pool"],
                job_id=str(row["job_id"]),
                execution_id=str(row["execution_id"]) if row["execution_id"] else None,
                detail={
                    "jobName": row["job_name"],
                    "handler": row["handler"],
                    "scheduledFor": row["due_for"].isoformat(),
                    "dueAt": row["due_at"].isoformat(),
                    "dispatched": row["execution_id"] is not None,
                },
            ),
        )
    return list(found.values())


class LateStarts:
    """Records ``execution.late`` incidents (one pass: :meth:`run_once`)."""

    def __init__(self, store: NotificationStore, config: LateStartsConfig) -> None:
        self.store = store
        self.config = config

    async def run_once(self) -> LateStartsPass:
        rows = await self.store.late_starts(self.config.grace_sec, self.config.batch)
        if not rows:
            return LateStartsPass()
        incidents, _deliveries = await self.store.record_incidents(late_incidents(rows))
        return LateStartsPass(late=len(rows), incidents=incidents)


def outcome_incidents(rows: Iterable[Record]) -> list[Incident]:
    """One ``execution.failing`` or ``execution.recovered`` incident per job whose latest finished occurrence
    ended otherwise than the one before it (and after its tenant subscribed)."""
    incidents = []
    for row in rows:
        outcome, previous = row["outcome"], row["previous_outcome"]
        if outcome is None or previous is None or outcome == previous or row["finished_at"] < row["since"]:
            continue
        event = CHANGE_TO[outcome]
        error = row["error"] if outcome == "DEAD" else None
        incidents.append(
            Incident(
                tenant_id=row["tenant_id"],
                event=event,
                incident_key=f"{event}:{row['execution_id']}",
                pool=row["pool"],
                job_id=str(row["job_id"]),
                execution_id=str(row["execution_id"]),
                detail={
                    "jobName": row["job_name"],
                    "handler": row["handler"],
                    "scheduledFor": row["scheduled_for"].isoformat(),
                    "finishedAt": row["finished_at"].isoformat(),
                    "previousExecutionId": str(row["previous_id"]),
                    "previousScheduledFor": row["previous_scheduled_for"].isoformat(),
                    "errorClass": error.split(":", 1)[0] if error else None,
                },
            )
        )
    return incidents


@dataclass(frozen=True)
class OutcomeChangesConfig:
    """``interval_sec``: between passes (each looks at every job of the subscribed tenants); ``batch``: jobs
    read per statement."""

    interval_sec: float = 30.0
    batch: int = 500

    def __post_init__(self) -> None:
        if self.interval_sec <= 0 or self.batch < 1:
            raise ValueError("interval_sec must be > 0 and batch >= 1")


@dataclass(frozen=True)
class OutcomeChangesPass:
    jobs: int = 0
    incidents: int = 0


class OutcomeChanges:
    """Records ``execution.failing`` and ``execution.recovered`` incidents (one pass: :meth:`run_once`)."""

    def __init__(self, store: NotificationStore, config: OutcomeChangesConfig) -> None:
        self.store = store
        self.config = config

    async def run_once(self) -> OutcomeChangesPass:
        jobs = incidents = 0
        after = FIRST_JOB
        while True:
            rows = await self.store.last_outcomes(after, self.config.batch)
            jobs += len(rows)
            found = outcome_incidents(rows)
            if found:
                incidents += (await self.store.record_incidents(found))[0]
            if len(rows) < self.config.batch:
                return OutcomeChangesPass(jobs=jobs, incidents=incidents)
            after = rows[-1]["job_id"]


@dataclass(frozen=True)
class IncidentRetentionConfig:
    """``keep_days``: how long incidents and their deliveries are kept; ``interval_sec``: between passes;
    ``batch``: incidents deleted per statement (a pass repeats it while batches come back full)."""

    keep_days: int = 30
    interval_sec: float = 600.0
    batch: int = 1000

    def __post_init__(self) -> None:
        if self.keep_days < 1 or self.interval_sec <= 0 or self.batch < 1:
            raise ValueError("keep_days must be >= 1, interval_sec > 0 and batch >= 1")


class IncidentRetention:
    """Deletes incidents past ``keep_days`` (one pass: :meth:`run_once`, answering how many went)."""

    def __init__(self, store: NotificationStore, config: IncidentRetentionConfig) -> None:
        self.store = store
        self.config = config

    async def run_once(self) -> int:
        deleted = 0
        while True:
            batch = await self.store.prune_incidents(self.config.keep_days, self.config.batch)
            deleted += batch
            if batch < self.config.batch:
                return deleted
