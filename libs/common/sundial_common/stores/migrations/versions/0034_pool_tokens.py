"""pool_tokens: the registry of pool tokens, the credentials of workers behind the worker gateway.

Revision ID: 0034
Revises: 0033
Create Date: 2026-11-28

A pool token lets its holder take one tenant's work from one pool through the worker gateway. The JWT itself is
short-lived and refreshed; this row is what lives on: which pool and tenant it serves, who minted it, the lifetime
of each refreshed JWT, and whether it was revoked. The gateway reads it on use (through a cache of a couple of
seconds), so a revoked token stops working at once everywhere. A new table: expand-only, the previous release
never reads it.

**Down**: the table goes.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
        CREATE TABLE IF NOT EXISTS pool_tokens (
            id          text PRIMARY KEY,
            pool        text NOT NULL,
            tenant      text NOT NULL,
            subject     text NOT NULL,
            created_by  text NOT NULL,
            ttl_sec     integer NOT NULL CHECK (ttl_sec > 0),
            created_at  timestamptz NOT NULL DEFAULT now(),
            revoked_at  timestamptz
        );
        CREATE INDEX IF NOT EXISTS pool_tokens_pool ON pool_tokens (pool, created_at);
        """
    )


def downgrade() -> None:
    run_sql_script("DROP TABLE IF EXISTS pool_tokens;")
