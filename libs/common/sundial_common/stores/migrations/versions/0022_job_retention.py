"""jobs_ended_idx, job_triggers_consumed_idx: the sweeper's job retention finds what it deletes through indexes.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-26

A one-shot job (ONE_SHOT, DELAYED) is a row per occurrence: once it is COMPLETED (fired) or CANCELLED, nothing
reads it but the API, and at a few thousand jobs a second the table grew by hundreds of millions of rows a day,
forever. The sweeper's job retention (:mod:`sundial_sweeper.job_retention`) deletes such a job once none of its
executions can remain (it ended before the oldest day of ``executions`` that is left). This partial index holds
exactly those jobs, by when they ended (``updated_at``, set by the change that ended them), so a pass reads the
oldest first without scanning the table; a job enters it when it ends (an update that already changes an
indexed predicate: never a heap-only one) and leaves it when it is deleted. Recurring jobs and DEPENDENT ones
are not in it: they are one row per schedule, not per occurrence. ``job_triggers_consumed_idx`` does the same for
the triggers a DEPENDENT job consumed (one per parent execution that fired it, kept forever until now).

**Down**: the indexes go.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        "CREATE INDEX jobs_ended_idx ON jobs (updated_at)"
        " WHERE state IN ('COMPLETED', 'CANCELLED') AND type IN ('ONE_SHOT', 'DELAYED');"
        " CREATE INDEX job_triggers_consumed_idx ON job_triggers (consumed_at) WHERE consumed_at IS NOT NULL;"
    )


def downgrade() -> None:
    run_sql_script("DROP INDEX jobs_ended_idx; DROP INDEX job_triggers_consumed_idx;")
