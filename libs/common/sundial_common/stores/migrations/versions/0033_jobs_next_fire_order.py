"""jobs_tenant_next_fire_idx: a tenant's jobs in next-fire order, for the console's jobs list sorted so.

Revision ID: 0033
Revises: 0032
Create Date: 2026-11-28

The console lists a tenant's jobs soonest next fire first (``list_jobs_by_next_fire``), by key on (next fire,
id). Without this index each page read and sorted every job of the tenant: with 100,000 jobs of one tenant, a
scan of the table taking 240 ms per page view on a loaded two-core machine, against under 1 ms with it (two index
ranges read from the cursor). Every change of ``next_fire_at`` (each fire) already updates ``jobs_due_idx``,
so such updates were never heap-only: this adds one index entry to each of them and takes nothing away.

**Down**: the index goes (expand-only: nothing else changes).
"""

from sundial_common.stores.schema import run_sql_script

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script("CREATE INDEX jobs_tenant_next_fire_idx ON jobs (tenant_id, next_fire_at, id);")


def downgrade() -> None:
    run_sql_script("DROP INDEX jobs_tenant_next_fire_idx;")
