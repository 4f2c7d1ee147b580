"""Initial schema: tenants, jobs, executions, attempts, shard fencing, append-only audit log.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from sundial_common.stores.schema import run_sql_script

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
    CREATE TABLE tenants (
        id          text PRIMARY KEY,
        created_at  timestamptz NOT NULL DEFAULT now()
    );

    -- A job is the definition; its next occurrence is next_fire_at (NULL once it can never fire again).
    CREATE TABLE jobs (
        id              uuid PRIMARY KEY,
        tenant_id       text NOT NULL REFERENCES tenants (id),
        name            text NOT NULL,
        type            text NOT NULL CHECK (type IN ('ONE_SHOT', 'DELAYED', 'CRON', 'INTERVAL', 'RUN_LIST')),
        schedule        text,
        timezone        text NOT NULL DEFAULT 'UTC',
        run_at          timestamptz,
        delay_seconds   integer,
        pool            text NOT NULL,
        handler         text NOT NULL,
        payload         jsonb NOT NULL DEFAULT '{}'::jsonb,
        retry_policy    jsonb NOT NULL DEFAULT '{}'::jsonb,
        timeout_sec     integer NOT NULL,
        priority        text NOT NULL DEFAULT 'NORMAL',
        state           text NOT NULL CHECK (state IN ('ACTIVE', 'PAUSED', 'COMPLETED', 'CANCELLED')),
        shard           integer NOT NULL,
        next_fire_at    timestamptz,
        fire_count      bigint NOT NULL DEFAULT 0,
        version         integer NOT NULL DEFAULT 1,
        traceparent     text,
        created_at      timestamptz NOT NULL DEFAULT now(),
        updated_at      timestamptz NOT NULL DEFAULT now()
    );
    -- The hydrator's range scan: per shard, active jobs by next fire time. Never a full scan.
    CREATE INDEX jobs_due_idx ON jobs (shard, next_fire_at, id)
        WHERE state = 'ACTIVE' AND next_fire_at IS NOT NULL;
    CREATE INDEX jobs_tenant_idx ON jobs (tenant_id, created_at DESC, id);

    -- One row per occurrence: (job_id, scheduled_for) is unique, which makes dispatch idempotent.
    CREATE TABLE executions (
        id              uuid PRIMARY KEY,
        tenant_id       text NOT NULL REFERENCES tenants (id),
        job_id          uuid NOT NULL REFERENCES jobs (id),
        scheduled_for   timestamptz NOT NULL,
        shard           integer NOT NULL,
        fence_token     bigint NOT NULL,
        pool            text NOT NULL,
        handler         text NOT NULL,
        state           text NOT NULL CHECK (state IN ('PENDING', 'RUNNING', 'SUCCEEDED', 'FAILED', 'TIMED_OUT',
                                                       'CANCELLED', 'FAILED_WORKER_LOST', 'DEAD', 'SKIPPED')),
        attempt         integer NOT NULL DEFAULT 1,
        max_attempts    integer NOT NULL DEFAULT 1,
        timeout_sec     integer NOT NULL,
        worker_id       text,
        trace_id        text,
        traceparent     text,
        result          jsonb,
        error           text,
        created_at      timestamptz NOT NULL DEFAULT now(),
        published_at    timestamptz,
        started_at      timestamptz,
        finished_at     timestamptz,
        CONSTRAINT executions_occurrence_key UNIQUE (job_id, scheduled_for)
    );
    CREATE INDEX executions_job_idx ON executions (job_id, scheduled_for DESC, id);
    -- The sweeper's scans stay small: only the non-terminal rows are indexed.
    CREATE INDEX executions_open_idx ON executions (state, created_at) WHERE state IN ('PENDING', 'RUNNING');

    -- Every attempt is kept: who ran it, when, how it ended, what progress it reported.
    CREATE TABLE execution_attempts (
        execution_id    uuid NOT NULL REFERENCES executions (id),
        attempt         integer NOT NULL,
        tenant_id       text NOT NULL REFERENCES tenants (id),
        worker_id       text NOT NULL,
        state           text NOT NULL,
        started_at      timestamptz NOT NULL DEFAULT now(),
        finished_at     timestamptz,
        error           text,
        progress        jsonb,
        PRIMARY KEY (execution_id, attempt)
    );

    -- Fencing (DESIGN invariant 4): the highest leadership token that has written for a shard.
    CREATE TABLE shard_fence (
        shard       integer PRIMARY KEY,
        token       bigint NOT NULL,
        holder      text NOT NULL,
        updated_at  timestamptz NOT NULL DEFAULT now()
    );

    -- Every transition, appended; never updated or deleted (enforced below).
    CREATE TABLE audit_log (
        id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at          timestamptz NOT NULL DEFAULT now(),
        tenant_id   text NOT NULL,
        entity      text NOT NULL CHECK (entity IN ('job', 'execution')),
        entity_id   uuid NOT NULL,
        action      text NOT NULL,
        from_state  text,
        to_state    text,
        actor       text NOT NULL,
        detail      jsonb
    );
    CREATE INDEX audit_entity_idx ON audit_log (entity_id, id);

    CREATE FUNCTION audit_log_is_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'audit_log is append-only';
    END $$;
    CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
        FOR EACH ROW EXECUTE FUNCTION audit_log_is_append_only();
    """
    )


def downgrade() -> None:
    run_sql_script(
        """
    DROP TABLE audit_log, shard_fence, execution_attempts, executions, jobs, tenants;
    DROP FUNCTION audit_log_is_append_only();
    """
    )
