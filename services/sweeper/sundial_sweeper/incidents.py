"""The incidents the sweeper notices for notification subscriptions: an execution that went DEAD.

The sweeper already reads every DEAD execution once, from the dead-letter outbox, before it publishes the
dead letter and marks the row; it records the incidents of those rows first
(:meth:`~sundial_common.stores.notifications.NotificationStore.record_incidents`). A pass that dies between
the two reads the same rows again, and their incidents, keyed ``execution.dead:<execution id>``, are already
there: one incident per execution, whichever sweeper replica recorded it. The incident carries no tenant data
the sweeper could not read in the clear: the error's class, never its (sealed) message.
"""

from __future__ import annotations

from collections.abc import Iterable

from sundial_common.stores.notifications import Incident
from sundial_common.stores.types import Record

DEAD = "execution.dead"


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
