"""The time-zone rules each zone's stored next fires were computed with.

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-28

Governments move DST dates and an upgrade brings new tzdata: a CRON job's stored next fire, computed under the
old rules, may then be at the wrong instant. The hydrator keeps a fingerprint of each zone's rules in use here
and, when its own differ, recomputes that zone's next fires once (``sundial_hydrator.zone_rules``).

**Down**: drops the table (the next upgrade records the fingerprints again, changing nothing).
"""

from sundial_common.stores.schema import run_sql_script

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
        CREATE TABLE zone_rules (
            zone         text PRIMARY KEY,
            fingerprint  text NOT NULL,
            recorded_at  timestamptz NOT NULL DEFAULT now()
        );
        """
    )


def downgrade() -> None:
    run_sql_script("DROP TABLE zone_rules;")
