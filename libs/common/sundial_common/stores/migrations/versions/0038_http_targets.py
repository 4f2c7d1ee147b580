"""http_targets: pools delivered over HTTP and their targets.

Revision ID: 0038
Revises: 0037
Create Date: 2026-11-28

``pools.delivery`` says who runs a pool's executions: ``worker`` (the tenant's own workers, as before) or ``http``
(Sundial's delivery workers POST each one to the pool's target). It is added with a default, so the previous
release, which neither reads nor writes it, keeps running on this schema and every existing pool stays ``worker``.

``pool_targets`` holds a pool's base URL, its per-handler paths and its signing secrets (sealed under the owning
tenant's data key): a new table, expand-only.

**Down**: the table and the column go.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0038"
down_revision = "0037"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
        ALTER TABLE pools ADD COLUMN IF NOT EXISTS delivery text NOT NULL DEFAULT 'worker'
            CHECK (delivery IN ('worker', 'http'));
        CREATE TABLE IF NOT EXISTS pool_targets (
            pool        text PRIMARY KEY,
            tenant_id   text NOT NULL,
            url         text NOT NULL,
            paths       jsonb NOT NULL DEFAULT '{}'::jsonb,
            secrets     text NOT NULL,
            updated_by  text NOT NULL,
            created_at  timestamptz NOT NULL DEFAULT now(),
            updated_at  timestamptz NOT NULL DEFAULT now()
        );
        """
    )


def downgrade() -> None:
    run_sql_script(
        """
        DROP TABLE IF EXISTS pool_targets;
        ALTER TABLE pools DROP COLUMN IF EXISTS delivery;
        """
    )
