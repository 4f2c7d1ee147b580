"""A backfill that was DONE at its creation (nothing missing in its range) gets its finished_at.

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-27

A backfill whose range had no occurrence without an execution was written DONE with no ``finished_at``. Job
retention (``prune_ended_jobs``) keeps a job while a backfill of it has none (it may still be creating
executions), so such a backfill kept its job, once ended, for ever. The insert now sets it; the rows written
before get their creation instant, when they were done.

**Down**: nothing to undo (the instants are true; the old insert simply did not write them).
"""

from sundial_common.stores.schema import run_sql_script

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script("UPDATE backfills SET finished_at = created_at WHERE state = 'DONE' AND finished_at IS NULL;")


def downgrade() -> None:
    pass
