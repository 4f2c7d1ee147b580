"""drop executions_job_idx: the occurrence key already orders a job's executions.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21

``executions_occurrence_key`` is UNIQUE (job_id, scheduled_for), so it serves "a job's executions, newest
first" (the API's latest executions and its keyset pages; the ``id`` tie-break on top is an incremental sort
of single rows). ``executions_job_idx`` (job_id, scheduled_for DESC, id) held the same entries again, and
every execution writes its index entries three times (dispatch, start and finish each change ``state``, which
other indexes carry, so none of these updates is HOT): dropping it saves three random B-tree inserts per
execution on the dispatch path (found by profiling the benchmark).
"""

from sundial_common.stores.schema import run_sql_script

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script("DROP INDEX executions_job_idx;")


def downgrade() -> None:
    run_sql_script("CREATE INDEX executions_job_idx ON executions (job_id, scheduled_for DESC, id);")
