"""jobs_trigger_execution_idx: a triggered run is readable by its execution id before the dispatcher creates it.

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-28

``POST /v1/jobs/{id}/trigger`` answers 202 with the id of an execution the shard leader creates moments later;
until then ``GET /v1/executions/{id}`` answers it from the job's pending trigger (``pending_trigger``), found
through this index. It is partial: only jobs holding a trigger are in it (a handful at any time), and a
dispatch that leaves ``trigger_execution_id`` NULL does not touch it (its heap-only updates stay heap-only).

**Down**: drops the index (expand-only: nothing else changes).
"""

from sundial_common.stores.schema import run_sql_script

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        "CREATE INDEX jobs_trigger_execution_idx ON jobs (trigger_execution_id) WHERE trigger_execution_id IS NOT NULL;"
    )


def downgrade() -> None:
    run_sql_script("DROP INDEX jobs_trigger_execution_idx;")
