"""The incidents the sweeper notices for notification subscriptions: an execution that went DEAD, a retry
breaker that opened or closed.

The sweeper already reads every DEAD execution once, from the dead-letter outbox, before it publishes the
dead letter and marks the row; it records the incidents of those rows first
(:meth:`~sundial_common.stores.notifications.NotificationStore.record_incidents`). A pass that dies between
the two reads the same rows again, and their incidents, keyed ``execution.dead:<execution id>``, are already
there: one incident per execution, whichever sweeper replica recorded it. The incident carries no tenant data
the sweeper could not read in the clear: the error's class, never its (sealed) message.

A breaker's incidents are its state changes as users see them: **opened** when it leaves CLOSED, **closed**
when it comes back to CLOSED (its probes through HALF_OPEN and back to OPEN are one long outage, not new ones).
Each is keyed by the breaker and the version its compare-and-set gave it, so an incident is recorded once even
if two sweepers judged the same window; it is recorded just after the move, so a sweeper that dies in between
loses that one notification (the move, and its audit row, stand).
"""

from __future__ import annotations

from collections.abc import Iterable

from sundial_common.stores.breakers import CLOSED, Breaker
from sundial_common.stores.notifications import Incident
from sundial_common.stores.types import Record

DEAD = "execution.dead"
BREAKER_OPENED = "breaker.opened"
BREAKER_CLOSED = "breaker.closed"


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


def breaker_incident(before: Breaker, after: Breaker) -> Incident | None:
    """The incident of a breaker's move from ``before`` to ``after``, if users would call it one."""
    if before.state == CLOSED and after.state != CLOSED:
        event = BREAKER_OPENED
    elif before.state != CLOSED and after.state == CLOSED:
        event = BREAKER_CLOSED
    else:
        return None
    return Incident(
        tenant_id=after.tenant_id,
        event=event,
        incident_key=f"{event}:{after.id}:{after.version}",
        pool=after.pool,
        detail={
            "breakerId": str(after.id),
            "handler": after.handler,
            "state": after.state,
            "attempts": after.attempts,
            "failures": after.failures,
            "manual": after.manual,
        },
    )
