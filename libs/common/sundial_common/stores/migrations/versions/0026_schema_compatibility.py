"""Which code may run on this schema: the oldest migration a process must know to run on it.

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-28

Migrations are expand-only within a release: a process of the previous release keeps running on the new schema
while the fleet rolls (:mod:`sundial_common.stores.schema`). A migration that breaks that rule (a contract
step: a dropped or renamed column, a changed meaning) sets ``runs_with_code_from`` to its own revision; a
process that does not know that revision refuses to start, with a message, instead of failing on some query
later. Expand-only migrations leave the row as it is.

**Down**: drops the table (processes then check nothing).
"""

from sundial_common.stores.schema import run_sql_script

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
        CREATE TABLE schema_compatibility (
            only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
            runs_with_code_from text NOT NULL
        );
        INSERT INTO schema_compatibility (runs_with_code_from) VALUES ('0001');
        """
    )


def downgrade() -> None:
    run_sql_script("DROP TABLE schema_compatibility;")
