"""jobs.key, jobs.key_digest, jobs_tenant_key_idx: a job addressable by a key its tenant chose, unique per tenant.

Revision ID: 0032
Revises: 0031
Create Date: 2026-11-28

A job was addressable only by its UUID, and ``name`` is a free label (not unique), so a deployment script could not
say "the nightly report job" and mean exactly one job, nor re-run safely: each run registered the job again. A
create may now give a ``key``; a second create with the same key answers the existing job when its body is the
same (``key_digest`` is the SHA-256 of the body that registered it) and 409 naming the key otherwise.

Two nullable columns and a partial unique index over the jobs that have a key (none yet, so it is small and quick
to build; the dispatcher's updates never touch ``key``, so they stay heap-only). Expand-only: the previous release
neither reads nor writes the columns, and its creates leave them NULL, outside the index.

**Down**: the index and the columns go (the keys with them; the jobs stay, addressable by id).
"""

from sundial_common.stores.schema import run_sql_script

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
        ALTER TABLE jobs ADD COLUMN key text, ADD COLUMN key_digest text;
        CREATE UNIQUE INDEX jobs_tenant_key_idx ON jobs (tenant_id, key) WHERE key IS NOT NULL;
        """
    )


def downgrade() -> None:
    run_sql_script("DROP INDEX jobs_tenant_key_idx; ALTER TABLE jobs DROP COLUMN key_digest, DROP COLUMN key;")
