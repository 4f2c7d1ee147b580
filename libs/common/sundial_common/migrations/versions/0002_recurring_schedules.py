"""recurring schedules: schema for issue 3.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from sundial_common.migrate import run_sql_script

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script("SELECT 1")


def downgrade() -> None:
    run_sql_script("SELECT 1")
