"""pool_episodes: for each (tenant, pool) watched by a notification, whether its work waits for a worker now;
the confirmation of a subscription's e-mail address; and the destinations an administrator allowed one tenant.

Revision ID: 0037
Revises: 0036
Create Date: 2026-11-28

A pool has work and no live worker for a while, then a worker appears: one episode, told once as
``pool.unserved`` and once as ``pool.served``. The sweeper decides it from Redis (the workers' announcements)
and Postgres (the backlog), and Redis forgets; so an episode's start is kept here, one row per (tenant, pool),
written only for tenants subscribed to those events. Opening and closing an episode are compare-and-sets on
``unserved_since`` that record their incident in the same transaction: two sweepers (a failover) tell an
episode once. ``episode`` counts them, and names each incident.

An e-mail subscription's ``url`` is ``mailto:<address>``; it delivers nothing until the address is confirmed by
the link sent to it: ``email_token_digest`` is the SHA-256 of that link's token, ``email_confirmed_at`` when it
was followed. Both are nullable columns a previous release never reads.

``notification_allowed_destinations``: an administrator let one tenant's subscriptions reach one destination
(scheme, host and port) at the addresses it resolved to then, though they are not public. A subscription made to
it keeps that allowance (``allowed_origin``, ``allowed_addresses``) until the administrator withdraws it.

**Down**: the tables and the columns go.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0037"
down_revision = "0036"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
        CREATE TABLE pool_episodes (
            tenant_id       text NOT NULL,
            pool            text NOT NULL,
            episode         integer NOT NULL DEFAULT 0,
            unserved_since  timestamptz,
            served_at       timestamptz,
            PRIMARY KEY (tenant_id, pool)
        );
        ALTER TABLE notification_subscriptions
            ADD COLUMN email_token_digest bytea,
            ADD COLUMN email_confirmed_at timestamptz;
        ALTER TABLE notification_subscriptions
            ADD COLUMN allowed_origin text,
            ADD COLUMN allowed_addresses text[];
        CREATE TABLE notification_allowed_destinations (
            tenant_id   text NOT NULL,
            origin      text NOT NULL,
            addresses   text[] NOT NULL,
            allowed_by  text NOT NULL,
            created_at  timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (tenant_id, origin)
        );
        CREATE UNIQUE INDEX notification_subscriptions_email_token_idx
            ON notification_subscriptions (email_token_digest) WHERE email_token_digest IS NOT NULL;
        """
    )


def downgrade() -> None:
    run_sql_script(
        "DROP TABLE pool_episodes; DROP TABLE notification_allowed_destinations; "
        "ALTER TABLE notification_subscriptions DROP COLUMN email_token_digest, DROP COLUMN email_confirmed_at, "
        "DROP COLUMN allowed_origin, DROP COLUMN allowed_addresses;"
    )
