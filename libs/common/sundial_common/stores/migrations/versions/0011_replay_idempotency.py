"""replays.idempotency_key: a retried ``POST /v1/replays`` starts one replay, not two.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24

The key is unique per tenant (the partial index skips replays created without one); ``request_hash`` tells
a repeat of the same request (answered with the replay it created) from another request reusing the key (422).
Kept with the replay itself, for as long as the replay row is kept.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        "ALTER TABLE replays ADD COLUMN idempotency_key text, ADD COLUMN request_hash bytea;"
        " CREATE UNIQUE INDEX replays_idempotency_key ON replays (tenant_id, idempotency_key)"
        " WHERE idempotency_key IS NOT NULL;"
    )


def downgrade() -> None:
    run_sql_script(
        "DROP INDEX replays_idempotency_key; ALTER TABLE replays DROP COLUMN idempotency_key, DROP COLUMN request_hash;"
    )
