"""bulk_operations, bulk_operation_items: one action on every job or execution a filter selects, run durably.

Revision ID: 0036
Revises: 0035
Create Date: 2026-11-28

``bulk_operations`` is one request (``POST /v1/bulk-operations``): its target (executions or jobs), action,
filter and tenant, its lifecycle (PREPARING → RUNNING → SUCCEEDED | FAILED | CANCELLED) and its counters.
``created_at`` is the selection's watermark: only rows created up to it are ever selected, so rows made after the
request are never touched, however late the selection is fixed.

``bulk_operation_items`` is the fixed selection: one row per selected id in the order it is acted on, ``outcome``
NULL until then. The runner acts on a batch and records its outcomes in one transaction, so a runner killed at
any moment resumes at the first item without an outcome and acts on no id twice.

New tables only: expand-only, the previous release never reads them.

**Down**: the tables go (with the operations they hold).
"""

from sundial_common.stores.schema import run_sql_script

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
    CREATE TABLE bulk_operations (
        id                  uuid PRIMARY KEY,
        -- Whose rows it acts on (an admin's operation names one tenant; never several).
        tenant_id           text NOT NULL,
        created_by          text NOT NULL,
        target              text NOT NULL CHECK (target IN ('executions', 'jobs')),
        action              text NOT NULL,
        filter              jsonb NOT NULL,
        rate_per_sec        integer NOT NULL CHECK (rate_per_sec > 0),
        state               text NOT NULL DEFAULT 'PREPARING'
                            CHECK (state IN ('PREPARING', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED')),
        total               bigint,
        done                bigint NOT NULL DEFAULT 0,
        skipped             bigint NOT NULL DEFAULT 0,
        failed              bigint NOT NULL DEFAULT 0,
        -- The seq of the last item with an outcome: the runner's cursor.
        cursor_seq          bigint NOT NULL DEFAULT 0,
        resumes             integer NOT NULL DEFAULT 0,
        idempotency_key     text,
        request_hash        bytea,
        cancel_requested_at timestamptz,
        error               text,
        created_at          timestamptz NOT NULL DEFAULT now(),
        started_at          timestamptz,
        finished_at         timestamptz,
        updated_at          timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX bulk_operations_tenant_idx ON bulk_operations (tenant_id, id);
    CREATE UNIQUE INDEX bulk_operations_idempotency_key ON bulk_operations (tenant_id, idempotency_key)
        WHERE idempotency_key IS NOT NULL;
    -- The runner's scan of work to do (only unfinished operations are in it).
    CREATE INDEX bulk_operations_active_idx ON bulk_operations (id) WHERE state IN ('PREPARING', 'RUNNING');
    -- Retention: finished operations by age.
    CREATE INDEX bulk_operations_finished_idx ON bulk_operations (finished_at) WHERE finished_at IS NOT NULL;

    CREATE TABLE bulk_operation_items (
        operation_id    uuid NOT NULL REFERENCES bulk_operations (id) ON DELETE CASCADE,
        seq             bigint NOT NULL,
        target_id       uuid NOT NULL,
        outcome         text CHECK (outcome IN ('DONE', 'SKIPPED', 'FAILED')),
        reason          text,
        acted_at        timestamptz,
        PRIMARY KEY (operation_id, seq)
    );
    """
    )


def downgrade() -> None:
    run_sql_script("DROP TABLE bulk_operation_items, bulk_operations;")
