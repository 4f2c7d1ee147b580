"""jobs_labels_idx: ``GET /v1/jobs?label=k:v`` finds a tenant's labelled jobs through an index.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24

Until now the label filter (``labels @> {...}``) was applied to every job of the tenant that the tenant's
index returned: a tenant with millions of jobs paid a scan of all of them for a label on a few. A GIN index
(``jsonb_path_ops``: containment only, a third of the default operator class's size) answers the containment
directly. It is partial: jobs without labels (most, and every job created before labels existed) are not in
it and cost nothing more to insert; the listing query names ``labels <> '{}'`` beside the filter so that the
planner may use it (a filter always names at least one label).
"""

from sundial_common.stores.schema import run_sql_script

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        "CREATE INDEX jobs_labels_idx ON jobs USING gin (labels jsonb_path_ops) WHERE labels <> '{}'::jsonb;"
    )


def downgrade() -> None:
    run_sql_script("DROP INDEX jobs_labels_idx;")
