"""tenants: the registry (weight, quotas, default cron jitter, ACTIVE/SUSPENDED), job labels.

Revision ID: 0009
Revises: 0005
Create Date: 2026-11-23

Until now a tenant row was created on a tenant's first job, for whatever name a token carried. The
registry makes tenants explicit: the API accepts only tokens of registered, active tenants. Rows that
already exist (tenants that have jobs) stay registered and active, so an upgrade locks nobody out.

Quota columns are nullable: NULL is unlimited. ``jobs_tenant_open_idx`` makes the ``maxActiveJobs`` check an
index-only count of the tenant's ACTIVE and PAUSED jobs. ``jobs.labels`` (a string map) is filtered with
``@>`` after the tenant's index narrows the rows (a GIN index would cost every insert; see docs/guides/tenants.md).
Every added column is nullable or has a constant default: a catalogue change, not a rewrite.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
    ALTER TABLE tenants
        ADD COLUMN display_name text,
        ADD COLUMN weight integer NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000),
        ADD COLUMN max_active_jobs integer CHECK (max_active_jobs >= 0),
        ADD COLUMN max_creates_per_sec double precision CHECK (max_creates_per_sec > 0),
        ADD COLUMN max_concurrent_executions integer CHECK (max_concurrent_executions >= 1),
        ADD COLUMN max_dispatch_per_sec double precision CHECK (max_dispatch_per_sec > 0),
        ADD COLUMN default_jitter_sec integer NOT NULL DEFAULT 0 CHECK (default_jitter_sec >= 0),
        ADD COLUMN state text NOT NULL DEFAULT 'ACTIVE' CHECK (state IN ('ACTIVE', 'SUSPENDED')),
        ADD COLUMN version integer NOT NULL DEFAULT 1,
        ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now();
    ALTER TABLE jobs ADD COLUMN labels jsonb NOT NULL DEFAULT '{}'::jsonb;
    CREATE INDEX jobs_tenant_open_idx ON jobs (tenant_id) WHERE state IN ('ACTIVE', 'PAUSED');
    """
    )


def downgrade() -> None:
    run_sql_script(
        """
    DROP INDEX jobs_tenant_open_idx;
    ALTER TABLE jobs DROP COLUMN labels;
    ALTER TABLE tenants
        DROP COLUMN display_name, DROP COLUMN weight, DROP COLUMN max_active_jobs, DROP COLUMN max_creates_per_sec,
        DROP COLUMN max_concurrent_executions, DROP COLUMN max_dispatch_per_sec, DROP COLUMN default_jitter_sec,
        DROP COLUMN state, DROP COLUMN version, DROP COLUMN updated_at;
    """
    )
