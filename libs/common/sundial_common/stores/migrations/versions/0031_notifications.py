"""notification_subscriptions, notification_incidents, notification_deliveries: telling owners what went wrong.

Revision ID: 0031
Revises: 0030
Create Date: 2026-11-28

A tenant subscribes a webhook to events of its own jobs (all of them, one pool's, or one job's). Whoever
notices an event records an **incident** under a key that names the event and its subject
(``execution.dead:<execution id>``): the key is unique, so a sweeper that takes over from one that crashed
half-way records the same incident again as nothing, never twice. In the same statement each matching
subscription gets a **delivery**, a row that lives until the receiver answered 2xx or the attempts ran out;
its id is the ``webhook-id`` of every attempt, so receivers deduplicate retries. Subscriptions' secrets are
sealed under the tenant's data key (``secrets``, a sealed JSON list, the newest first); after a rotation the
previous one still signs until ``previous_secret_until``, so receivers can switch without losing a request.

New tables only: expand-only, nothing of the previous release reads or writes them.

**Down**: the tables go (with what they hold).
"""

from sundial_common.stores.schema import run_sql_script

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
        CREATE TABLE notification_subscriptions (
            id            uuid PRIMARY KEY,
            tenant_id     text NOT NULL,
            created_by    text NOT NULL,
            events        text[] NOT NULL,
            pool          text,
            job_id        uuid,
            url           text NOT NULL,
            secrets       jsonb NOT NULL,
            previous_secret_until timestamptz,
            description   text,
            created_at    timestamptz NOT NULL DEFAULT now(),
            deleted_at    timestamptz
        );
        CREATE INDEX notification_subscriptions_tenant_idx
            ON notification_subscriptions (tenant_id) WHERE deleted_at IS NULL;

        CREATE TABLE notification_incidents (
            id            uuid PRIMARY KEY,
            tenant_id     text NOT NULL,
            event         text NOT NULL,
            incident_key  text NOT NULL UNIQUE,
            pool          text,
            job_id        uuid,
            execution_id  uuid,
            detail        jsonb NOT NULL DEFAULT '{}'::jsonb,
            occurred_at   timestamptz NOT NULL DEFAULT now()
        );

        CREATE TABLE notification_deliveries (
            id               uuid PRIMARY KEY,
            incident_id      uuid NOT NULL REFERENCES notification_incidents (id) ON DELETE CASCADE,
            subscription_id  uuid NOT NULL REFERENCES notification_subscriptions (id) ON DELETE CASCADE,
            state            text NOT NULL DEFAULT 'PENDING',
            attempts         integer NOT NULL DEFAULT 0,
            next_attempt_at  timestamptz NOT NULL DEFAULT now(),
            claimed_until    timestamptz,
            last_status      integer,
            last_error       text,
            created_at       timestamptz NOT NULL DEFAULT now(),
            finished_at      timestamptz,
            UNIQUE (incident_id, subscription_id)
        );
        CREATE INDEX notification_deliveries_due_idx
            ON notification_deliveries (next_attempt_at) WHERE state = 'PENDING';
        CREATE INDEX notification_deliveries_log_idx
            ON notification_deliveries (subscription_id, created_at DESC);
        """
    )


def downgrade() -> None:
    run_sql_script("DROP TABLE notification_deliveries, notification_incidents, notification_subscriptions;")
