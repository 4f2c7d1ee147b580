"""execution_events: the outbox of execution lifecycle events that the analytics service copies to ClickHouse.

Revision ID: 0010
Revises: 0005
Create Date: 2026-11-23

Every change of an execution's state (or attempt, or a retry being scheduled) appends one row here, written
by statement-level triggers on ``executions`` in the same transaction as the change: whoever changes an
execution — dispatcher, worker, sweeper, API, or a stream not written yet — emits its event without knowing,
and a batched statement pays one extra ``INSERT … SELECT`` over its transition table, not one per row.

The analytics service reads the oldest rows, inserts them into ClickHouse and deletes exactly the ids it
read (consume-and-delete). A cursor on ``id`` would skip rows whose transaction took its id before, but
committed after, the rows already read (identity order is not commit order); deleting by id leaves any such
late row in the table for the next pass. ClickHouse deduplicates re-sent rows (ReplacingMergeTree on the
event id), so a crash between insert and delete only re-sends a batch.

Each row is self-contained — tenant, job, pool, handler, times, worker, error — so it can be replicated
after the execution itself is gone (Postgres retention deletes finished executions only once their events
have left this table). Executions that exist at upgrade are queued once as ``backfill`` events.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_COLUMNS = (
    "kind, execution_id, tenant_id, job_id, attempt, state, pool, handler, scheduled_for, fire_at, created_at,"
    " started_at, finished_at, worker_id, error"
)
_VALUES = (
    "n.id, n.tenant_id, n.job_id, n.attempt, n.state, n.pool, n.handler, n.scheduled_for, n.fire_at, n.created_at,"
    " n.started_at, n.finished_at, n.worker_id, left(n.error, 200)"
)


def upgrade() -> None:
    run_sql_script(
        f"""
    CREATE TABLE execution_events (
        id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        -- The changing transaction's start (now()): the same clock as the execution's own timestamps.
        at              timestamptz NOT NULL DEFAULT now(),
        kind            text NOT NULL,
        execution_id    uuid NOT NULL,
        tenant_id       text NOT NULL,
        job_id          uuid NOT NULL,
        attempt         integer NOT NULL,
        state           text NOT NULL,
        pool            text NOT NULL,
        handler         text NOT NULL,
        scheduled_for   timestamptz NOT NULL,
        fire_at         timestamptz,
        created_at      timestamptz NOT NULL,
        started_at      timestamptz,
        finished_at     timestamptz,
        worker_id       text,
        -- Only the head of the message: the error class is its prefix, the full text stays on the attempt.
        error           text
    );
    -- A queue: rows live seconds. Vacuum it far more eagerly than the default 20 % of a tiny table.
    ALTER TABLE execution_events SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000);

    CREATE FUNCTION execution_events_created() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO execution_events ({_COLUMNS})
        SELECT CASE n.state WHEN 'SKIPPED' THEN 'skipped' WHEN 'CANCELLED' THEN 'cancelled' ELSE 'created' END,
               {_VALUES}
        FROM new_rows n;
        RETURN NULL;
    END $$;

    CREATE FUNCTION execution_events_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO execution_events ({_COLUMNS})
        SELECT CASE
                   WHEN n.state = 'RUNNING' THEN 'started'
                   -- A scheduled retry moved back to PENDING with its next attempt.
                   WHEN n.state = 'PENDING' THEN 'requeued'
                   -- An attempt failed with attempts left, or a DEAD execution was given one more.
                   WHEN n.next_attempt_at IS NOT NULL AND o.next_attempt_at IS NULL THEN 'retried'
                   WHEN n.state = 'DEAD' THEN 'dead_lettered'
                   WHEN n.state = 'CANCELLED' THEN 'cancelled'
                   WHEN n.state = 'SKIPPED' THEN 'skipped'
                   ELSE 'finished'
               END,
               {_VALUES}
        FROM new_rows n JOIN old_rows o ON o.id = n.id
        WHERE n.state <> o.state OR n.attempt <> o.attempt
           OR (n.next_attempt_at IS NOT NULL AND o.next_attempt_at IS NULL);
        RETURN NULL;
    END $$;

    CREATE TRIGGER executions_events_created AFTER INSERT ON executions
        REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION execution_events_created();
    CREATE TRIGGER executions_events_changed AFTER UPDATE ON executions
        REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION execution_events_changed();

    INSERT INTO execution_events ({_COLUMNS}) SELECT 'backfill', {_VALUES} FROM executions n;
    """
    )


def downgrade() -> None:
    run_sql_script(
        """
    DROP TRIGGER executions_events_changed ON executions;
    DROP TRIGGER executions_events_created ON executions;
    DROP FUNCTION execution_events_changed();
    DROP FUNCTION execution_events_created();
    DROP TABLE execution_events;
    """
    )
