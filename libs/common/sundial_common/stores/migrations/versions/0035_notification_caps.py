"""notification_sends: the notification requests of the last minutes, for the per-minute caps.

Revision ID: 0035
Revises: 0034
Create Date: 2026-11-28

The API replicas claim due deliveries under caps per tenant and per destination (a subscription's URL): on the
requests in flight (a live claim on the delivery) and on the requests sent in the last minute. A delivery keeps
only its latest attempt, so each claimed attempt is written here as well (tenant, URL, time), in the claim's
transaction; the claims delete the rows older than two minutes, so the table holds a few minutes of sends.

New table only: expand-only; the previous release neither reads nor writes it (its claims are not counted).

**Down**: the table goes.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
        CREATE TABLE notification_sends (
            tenant_id  text NOT NULL,
            url        text NOT NULL,
            sent_at    timestamptz NOT NULL DEFAULT now()
        );
        CREATE INDEX notification_sends_time_idx ON notification_sends (sent_at);
        """
    )


def downgrade() -> None:
    run_sql_script("DROP TABLE notification_sends;")
