"""Jobs that run after other jobs (dependency edges, trigger rows, the executions they became), and backfills.

Revision ID: 0015
Revises: 0011
Create Date: 2026-11-24

A ``DEPENDENT`` job has no clock: it fires when its parents' executions reach the state each edge asks for
(``job_dependencies.on_state``). Whoever moves a parent's execution to a final state — a worker's finish,
the sweeper ending a lost or timed-out attempt, a cancel — records one ``job_triggers`` row per child in the
same transaction, written by a statement-level trigger on ``executions`` (as ``execution_events`` are, 0010):
no writer needs to know about dependencies, and a batch pays one ``INSERT … SELECT`` over its transition
table. ``UNIQUE (child_job_id, parent_execution_id)``: a completion reported twice records one trigger.

The leader of the child's shard turns pending triggers into executions under its fence
(``sundial_dispatcher.triggers``). ``executions.trigger_id`` names the trigger an execution was made of
(for a fan-in, the oldest of the triggers it consumed) and ``executions_trigger_key`` makes it unique per
child: exactly one execution per trigger, whatever fails over or repeats. ``caused_by`` lists the parent
executions it ran after.

``backfills``: ``POST /v1/jobs/{id}:backfill`` runs a recurring job's past occurrences that have no execution,
as a durable operation the leader of the job's shard advances under its fence (``sundial_dispatcher.backfills``):
``cursor`` is the last nominal time handled, so a leader that dies resumes where the last commit left off,
and ``(job_id, scheduled_for)`` stays the one guard against a second execution of an occurrence.
``executions.backfill_id`` tells which executions a backfill created (its ``finished`` count).
"""

from sundial_common.stores.schema import run_sql_script

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
    ALTER TABLE jobs DROP CONSTRAINT jobs_type_check;
    ALTER TABLE jobs ADD CONSTRAINT jobs_type_check
        CHECK (type IN ('ONE_SHOT', 'DELAYED', 'CRON', 'INTERVAL', 'RUN_LIST', 'DEPENDENT'));

    CREATE TABLE job_dependencies (
        child_job_id    uuid NOT NULL REFERENCES jobs (id),
        parent_job_id   uuid NOT NULL REFERENCES jobs (id),
        tenant_id       text NOT NULL,
        -- SUCCEEDED; FAILED (the parent's execution ended DEAD: failed with no attempts left); ANY final state.
        on_state        text NOT NULL CHECK (on_state IN ('SUCCEEDED', 'FAILED', 'ANY')),
        created_at      timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (child_job_id, parent_job_id)
    );
    -- The final-state trigger's probe: does this parent have children? (Almost always: no row.)
    CREATE INDEX job_dependencies_parent_idx ON job_dependencies (parent_job_id);

    CREATE TABLE job_triggers (
        id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
        tenant_id           text NOT NULL,
        child_job_id        uuid NOT NULL,
        shard               integer NOT NULL,
        parent_job_id       uuid NOT NULL,
        parent_execution_id uuid NOT NULL,
        parent_state        text NOT NULL,
        parent_traceparent  text,
        created_at          timestamptz NOT NULL DEFAULT now(),
        -- Set by the shard leader when it consumes the trigger: FIRED (into execution_id) or SKIPPED.
        consumed_at         timestamptz,
        outcome             text CHECK (outcome IN ('FIRED', 'SKIPPED')),
        execution_id        uuid,
        CONSTRAINT job_triggers_once UNIQUE (child_job_id, parent_execution_id)
    );
    -- The leader's scan: its shard's pending triggers, oldest first. Empty nearly all the time.
    CREATE INDEX job_triggers_pending_idx ON job_triggers (shard, created_at, id) WHERE consumed_at IS NULL;
    CREATE INDEX job_triggers_execution_idx ON job_triggers (execution_id) WHERE execution_id IS NOT NULL;

    ALTER TABLE executions ADD COLUMN trigger_id uuid, ADD COLUMN caused_by uuid[];
    CREATE UNIQUE INDEX executions_trigger_key ON executions (job_id, trigger_id) WHERE trigger_id IS NOT NULL;

    CREATE FUNCTION job_triggers_on_final() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO job_triggers (tenant_id, child_job_id, shard, parent_job_id, parent_execution_id, parent_state,
                                  parent_traceparent)
        SELECT d.tenant_id, d.child_job_id, c.shard, n.job_id, n.id, n.state, n.traceparent
        FROM new_rows n
        JOIN old_rows o ON o.id = n.id
        JOIN job_dependencies d ON d.parent_job_id = n.job_id
        JOIN jobs c ON c.id = d.child_job_id
        WHERE n.state <> o.state AND n.state IN ('SUCCEEDED', 'DEAD', 'CANCELLED') AND n.next_attempt_at IS NULL
          AND (d.on_state = 'ANY' OR (d.on_state = 'SUCCEEDED' AND n.state = 'SUCCEEDED')
               OR (d.on_state = 'FAILED' AND n.state = 'DEAD'))
          AND c.state IN ('ACTIVE', 'PAUSED')
        ON CONFLICT ON CONSTRAINT job_triggers_once DO NOTHING;
        RETURN NULL;
    END $$;
    CREATE TRIGGER executions_dependency_triggers AFTER UPDATE ON executions
        REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION job_triggers_on_final();

    CREATE TABLE backfills (
        id              uuid PRIMARY KEY,
        tenant_id       text NOT NULL REFERENCES tenants (id),
        job_id          uuid NOT NULL REFERENCES jobs (id),
        shard           integer NOT NULL,
        range_from      timestamptz NOT NULL,
        range_to        timestamptz NOT NULL,
        -- ALLOW: at rate_per_sec whatever is running; BUFFER_ONE: the next once the previous one has ended.
        overlap_policy  text NOT NULL CHECK (overlap_policy IN ('ALLOW', 'BUFFER_ONE')),
        rate_per_sec    double precision NOT NULL CHECK (rate_per_sec > 0),
        -- RUNNING (creating executions), DONE (every occurrence has its execution), CANCELLED.
        state           text NOT NULL CHECK (state IN ('RUNNING', 'DONE', 'CANCELLED')),
        total           integer NOT NULL,
        created         integer NOT NULL DEFAULT 0,
        -- The last nominal time handled (NULL: none yet); the leader continues strictly after it.
        cursor_at       timestamptz,
        -- When the rate budget was last spent: the next step may create rate × (now - stepped_at).
        stepped_at      timestamptz NOT NULL DEFAULT now(),
        actor           text,
        traceparent     text,
        created_at      timestamptz NOT NULL DEFAULT now(),
        finished_at     timestamptz
    );
    CREATE INDEX backfills_running_idx ON backfills (shard, id) WHERE state = 'RUNNING';
    CREATE INDEX backfills_job_idx ON backfills (job_id, id);
    ALTER TABLE executions ADD COLUMN backfill_id uuid;
    CREATE INDEX executions_backfill_idx ON executions (backfill_id, state) WHERE backfill_id IS NOT NULL;
    """
    )


def downgrade() -> None:
    run_sql_script(
        """
    DROP INDEX executions_backfill_idx;
    ALTER TABLE executions DROP COLUMN backfill_id;
    DROP TABLE backfills;
    DROP TRIGGER executions_dependency_triggers ON executions;
    DROP FUNCTION job_triggers_on_final();
    DROP INDEX executions_trigger_key;
    ALTER TABLE executions DROP COLUMN trigger_id, DROP COLUMN caused_by;
    DROP TABLE job_triggers;
    DROP TABLE job_dependencies;
    DELETE FROM jobs WHERE type = 'DEPENDENT';
    ALTER TABLE jobs DROP CONSTRAINT jobs_type_check;
    ALTER TABLE jobs ADD CONSTRAINT jobs_type_check
        CHECK (type IN ('ONE_SHOT', 'DELAYED', 'CRON', 'INTERVAL', 'RUN_LIST'));
    """
    )
