"""Envelope encryption: tenants' wrapped data keys and the master key's check value.

Revision ID: 0014
Revises: 0011
Create Date: 2026-11-24

``tenant_data_keys`` holds one AES-256 data key per tenant, wrapped (encrypted) by the master key, with the
check value of the master key that wrapped it; ``encryption_master`` is one row: the check value of the
master key every process must hold (recorded by the first process that starts), and during
``sundial keys rotate`` the one it moves to. No column changes type: sealed values are JSON strings in the
jsonb columns and prefixed bytes in ``idempotency_keys.body`` (:mod:`sundial_common.security.encryption`), so rows
written before this revision stay readable as they are.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
    CREATE TABLE encryption_master (
        singleton       boolean PRIMARY KEY DEFAULT true CHECK (singleton),
        key_check       text NOT NULL,
        rotating_to     text,
        updated_at      timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE tenant_data_keys (
        tenant_id       text PRIMARY KEY,
        wrapped_key     bytea NOT NULL,
        key_check       text NOT NULL,
        created_at      timestamptz NOT NULL DEFAULT now(),
        rotated_at      timestamptz
    );
    """
    )


def downgrade() -> None:
    # Dropping the wrapped data keys would make every sealed value unreadable for good: refuse while any exist.
    run_sql_script(
        """
    DO $$ BEGIN
        IF EXISTS (SELECT 1 FROM tenant_data_keys) THEN
            RAISE EXCEPTION 'tenant_data_keys is not empty: downgrading would make sealed data unreadable';
        END IF;
    END $$;
    DROP TABLE tenant_data_keys, encryption_master;
    """
    )
