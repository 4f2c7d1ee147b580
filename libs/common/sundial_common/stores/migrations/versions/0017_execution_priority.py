"""Each execution records the priority it was dispatched with.

Revision ID: 0017
Revises: 0015
Create Date: 2026-11-24

``jobs.priority`` (``HIGH``, ``NORMAL``, ``LOW``) orders a tenant's work in the dispatcher's fair queue
(``sundial_dispatcher.fairness``). The execution keeps the job's priority at the moment it was dispatched, so
a later ``PATCH`` of the job changes its next fires and not what an execution shows (``GET
/v1/executions/{id}``). Older rows get ``NORMAL``, which is what they were dispatched with (nothing read it).
A constant default: no table rewrite.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
    ALTER TABLE executions ADD COLUMN priority text NOT NULL DEFAULT 'NORMAL'
        CHECK (priority IN ('HIGH', 'NORMAL', 'LOW'));
    """
    )


def downgrade() -> None:
    run_sql_script("ALTER TABLE executions DROP COLUMN priority;")
