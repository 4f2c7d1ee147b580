"""execution_attempts.traceback, execution_attempts.log_tail: why an attempt failed, readable in one look.

Revision ID: 0030
Revises: 0029
Create Date: 2026-11-28

An attempt kept only ``Type: message`` of its handler's exception; the traceback and what the handler logged were
in the worker's log file alone, which the person reading ``GET /v1/executions/{id}`` rarely has. The worker now
writes with each outcome the handler's traceback (a failure only, its last 16 KB) and the last lines it logged
through ``ctx.logger`` (200 lines / 32 KB), both sealed like the error message (they carry tenants' data). Two
nullable columns: expand-only, so processes of the previous release keep writing attempts without them.

**Down**: the columns go (with what they hold).
"""

from sundial_common.stores.schema import run_sql_script

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script("ALTER TABLE execution_attempts ADD COLUMN traceback text, ADD COLUMN log_tail text;")


def downgrade() -> None:
    run_sql_script("ALTER TABLE execution_attempts DROP COLUMN traceback, DROP COLUMN log_tail;")
