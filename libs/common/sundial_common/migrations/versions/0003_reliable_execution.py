"""reliable execution: schema for issue 4.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from sundial_common.migrate import run_sql_script

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script("SELECT 1")


def downgrade() -> None:
    run_sql_script("SELECT 1")
