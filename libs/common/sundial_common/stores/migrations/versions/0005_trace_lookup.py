"""executions_trace_idx: find the execution of a trace; jobs.trigger_traceparent: a trigger's own trace.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

A support person holding a trace from Jaeger asks Sundial which execution it was. Trace ids are random,
so only an index finds one without scanning every execution of the tenant. It costs one B-tree entry per
execution write that is not HOT (dispatch, start, finish); the tenant is checked on the one row found.

``POST /v1/jobs/{id}/trigger`` stores its request's traceparent beside the pending trigger, so the
execution the dispatcher makes of it continues the trigger request's trace, as a one-off job's execution
continues its creating request's.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        "CREATE INDEX executions_trace_idx ON executions (trace_id);"
        " ALTER TABLE jobs ADD COLUMN trigger_traceparent text;"
    )


def downgrade() -> None:
    run_sql_script("DROP INDEX executions_trace_idx; ALTER TABLE jobs DROP COLUMN trigger_traceparent;")
