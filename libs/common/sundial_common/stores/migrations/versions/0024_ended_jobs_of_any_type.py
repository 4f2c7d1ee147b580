"""jobs_ended_idx holds every job that ended, of any type: job retention deletes cancelled recurring and DEPENDENT
jobs too.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-27

0022's retention deleted only one-shot jobs (ONE_SHOT, DELAYED) that ended. A recurring job a tenant cancelled
(CRON, INTERVAL, RUN_LIST), one whose schedule ran out (COMPLETED: ``endAt``, ``maxRuns``, the last run of a list)
and a cancelled DEPENDENT job were kept forever, with a DEPENDENT job's edges (``job_dependencies``): a tenant that
creates and cancels jobs programmatically grew ``jobs``, its indexes and the hydrator's scans without end. The
sweeper's job retention (:mod:`sundial_sweeper.job_retention`) now deletes any job that ended, by the same
horizon, so its partial index drops the type from its predicate and holds exactly the jobs that ended
(``COMPLETED``, ``CANCELLED``), by when they last changed.

Nothing changes on the dispatch path: ``updated_at`` and ``state`` were already in this index (the predicate
named ``type`` too), so no update that was heap-only stops being one, and a live job (ACTIVE, PAUSED) matches
neither predicate, so a dispatch adds no entry.

**Down**: 0022's index (one-shot jobs only) comes back.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        "DROP INDEX jobs_ended_idx;"
        " CREATE INDEX jobs_ended_idx ON jobs (updated_at) WHERE state IN ('COMPLETED', 'CANCELLED');"
    )


def downgrade() -> None:
    run_sql_script(
        "DROP INDEX jobs_ended_idx;"
        " CREATE INDEX jobs_ended_idx ON jobs (updated_at)"
        " WHERE state IN ('COMPLETED', 'CANCELLED') AND type IN ('ONE_SHOT', 'DELAYED');"
    )
