"""reliable execution: schema for retries, timeouts, cancellation, dead letters and idempotent create.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21

Executions learn to be retried and to die. ``next_attempt_at`` is set while a retry is scheduled (after a
FAILED, TIMED_OUT or FAILED_WORKER_LOST attempt with attempts left, or a manual retry of a DEAD one) and
cleared when the dispatcher moves the execution back to PENDING; a retry is a hot-window member like a job's
next fire, and ``executions_retry_idx`` is the hydrator's range scan over them (tiny: only scheduled
retries are in it). ``pending_since`` is when the execution last became PENDING, so the sweeper's republish
scan measures a retried attempt from its own dispatch, not from the first one's. ``dlq_published_at`` makes
the execution row the outbox of the ``sundial.dlq`` topic too.

``idempotency_keys`` remembers, per tenant and for 24 hours, what a ``POST /v1/jobs`` carrying an
``Idempotency-Key`` answered: the request's hash, and while the first request runs an in-flight claim
(``token`` and ``locked_until``); afterwards the exact status, headers and body it answered.

Every column added to ``executions`` is nullable: a catalogue change, not a rewrite.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
    ALTER TABLE executions
        ADD COLUMN next_attempt_at      timestamptz,
        ADD COLUMN pending_since        timestamptz,
        ADD COLUMN dlq_published_at     timestamptz;

    -- The hydrator's promotion and overdue scans of scheduled retries, per shard in due order.
    CREATE INDEX executions_retry_idx ON executions (shard, next_attempt_at, id) WHERE next_attempt_at IS NOT NULL;
    -- The sweeper's dead-letter outbox: DEAD executions whose message has not reached sundial.dlq yet.
    CREATE INDEX executions_dlq_outbox_idx ON executions (finished_at)
        WHERE state = 'DEAD' AND dlq_published_at IS NULL;
    -- GET /v1/executions?state=…: one tenant's executions in a state, newest first (ids are UUIDv7).
    CREATE INDEX executions_tenant_state_idx ON executions (tenant_id, state, id);

    CREATE TABLE idempotency_keys (
        tenant_id       text NOT NULL,
        key             text NOT NULL,
        -- SHA-256 of the request body as the API understood it: the same key with another body is a 422.
        request_hash    bytea NOT NULL,
        -- The claim of the request that holds the key; only its transaction may complete it.
        token           uuid NOT NULL,
        state           text NOT NULL CHECK (state IN ('IN_FLIGHT', 'DONE')),
        -- An IN_FLIGHT claim whose request died (the API crashed, Postgres restarted) may be taken over after this.
        locked_until    timestamptz,
        status_code     integer,
        headers         jsonb,
        body            bytea,
        resource_id     uuid,
        created_at      timestamptz NOT NULL DEFAULT now(),
        expires_at      timestamptz NOT NULL,
        PRIMARY KEY (tenant_id, key)
    );
    -- The sweeper's purge of keys past their 24 hours.
    CREATE INDEX idempotency_keys_expiry_idx ON idempotency_keys (expires_at);
    """
    )


def downgrade() -> None:
    run_sql_script(
        """
    DROP TABLE idempotency_keys;
    DROP INDEX executions_tenant_state_idx;
    DROP INDEX executions_dlq_outbox_idx;
    DROP INDEX executions_retry_idx;
    ALTER TABLE executions DROP COLUMN next_attempt_at, DROP COLUMN pending_since, DROP COLUMN dlq_published_at;
    """
    )
