"""How long a breaker may hold a retry: when an execution's hold began, and each breaker's bound.

Revision ID: 0029
Revises: 0028
Create Date: 2026-11-28

An open breaker held a retry until the breaker closed, however long: the executions of a handler that stays
broken never reached DEAD, so the dead-letter queue showed nothing. ``executions.held_since`` is when a breaker
first held the execution (kept across its probes and re-holds, cleared when its breaker releases it);
``breakers.max_hold_sec`` is the bound the sweeper last judged the breaker with (its tenant's ``maxHoldSec``),
which the dispatcher's retry gate reads. Expand only: both columns are new and nullable or defaulted, so the
previous release's processes run on this schema unchanged.

**Down**: drops both columns.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
        ALTER TABLE executions ADD COLUMN held_since timestamptz;
        ALTER TABLE breakers ADD COLUMN max_hold_sec double precision NOT NULL DEFAULT 3600;
        """
    )


def downgrade() -> None:
    run_sql_script(
        """
        ALTER TABLE breakers DROP COLUMN max_hold_sec;
        ALTER TABLE executions DROP COLUMN held_since;
        """
    )
