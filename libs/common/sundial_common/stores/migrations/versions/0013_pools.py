"""pools: the pool registry (owner or shared tenants, production or staging, topic settings, job defaults).

Revision ID: 0013
Revises: 0011
Create Date: 2026-11-24

Until now a pool was only a name in ``jobs.pool``: any tenant could send work into any pool. The registry
makes pools owned resources: the API accepts a job only for a registered pool its tenant may use (the owner,
or one of ``shared_with``), and only a ``staging`` pool can be a replay's target.

So that nothing stops on upgrade, every pool already in use is registered here: each pool of ``jobs`` owned
by its only tenant, or shared among its tenants when several use it; each replay target that no job uses is a
staging pool (owned or shared the same way by the tenants whose replays wrote to it). The ``staging-`` name
prefix, which told staging pools apart until now, decides their kind this one last time. Partitions and
retention stay NULL for these (their topics exist already, with whatever they were created with).
"""

from sundial_common.stores.schema import run_sql_script

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
    CREATE TABLE pools (
        name                  text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,62}$'),
        -- Exactly one of: an owner, or the tenants the pool is shared among.
        owner                 text REFERENCES tenants (id),
        shared_with           text[] NOT NULL DEFAULT '{}',
        kind                  text NOT NULL DEFAULT 'production' CHECK (kind IN ('production', 'staging')),
        partitions            integer CHECK (partitions BETWEEN 1 AND 1000),
        retention_ms          bigint CHECK (retention_ms >= 60000),
        default_timeout_sec   integer CHECK (default_timeout_sec >= 1),
        default_retry_policy  jsonb,
        version               integer NOT NULL DEFAULT 1,
        created_at            timestamptz NOT NULL DEFAULT now(),
        updated_at            timestamptz NOT NULL DEFAULT now(),
        CHECK ((owner IS NULL) = (cardinality(shared_with) > 0))
    );
    -- GET /v1/pools: the pools one tenant may use.
    CREATE INDEX pools_shared_with_idx ON pools USING gin (shared_with);

    WITH used AS (
        SELECT pool, tenant_id FROM jobs
        UNION
        SELECT target_pool, tenant_id FROM replays
        WHERE target_pool NOT IN (SELECT DISTINCT pool FROM jobs) AND tenant_id IN (SELECT id FROM tenants)
    ), per_pool AS (
        SELECT pool, array_agg(DISTINCT tenant_id ORDER BY tenant_id) AS tenants FROM used GROUP BY pool
    )
    INSERT INTO pools (name, owner, shared_with, kind)
    SELECT pool,
           CASE WHEN cardinality(tenants) = 1 THEN tenants[1] END,
           CASE WHEN cardinality(tenants) = 1 THEN '{}'::text[] ELSE tenants END,
           CASE WHEN pool LIKE 'staging-%' THEN 'staging' ELSE 'production' END
    FROM per_pool
    WHERE pool ~ '^[a-z0-9][a-z0-9._-]{0,62}$';
    """
    )


def downgrade() -> None:
    run_sql_script("DROP TABLE pools;")
