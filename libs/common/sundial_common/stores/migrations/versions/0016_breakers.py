"""breakers: the retry circuit breaker per (tenant, pool, handler), its window counts, and held retries.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-24

``breaker_counts`` is the sliding window: finished attempts (and how many failed: FAILED, TIMED_OUT, DEAD;
an attempt whose worker was lost counts neither way) per (tenant, pool, handler), second and writer slot. A
statement-level trigger on ``executions`` fills it, like ``execution_events`` (0010): whoever ends an attempt
— a worker's batched outcome write, the sweeper ending a lost or timed-out one — stamps ``finished_at =
now()`` and so counts it in the same transaction without knowing, one ``INSERT … ON CONFLICT`` per
statement (no measurable cost on a 256-outcome finish: bench/workloads/breaker.py). The ``slot`` (the backend's pid
modulo 8) keeps two writers of the same handler off the same row, so counting never serialises the workers'
outcome writes. The breaker loop (the sweeper) reads the last window's buckets and deletes older ones.

``breakers`` is the state every dispatcher leader and the sweeper read (Postgres truth, DESIGN invariant 1):
CLOSED → OPEN → HALF_OPEN → CLOSED (or OPEN again with a longer cool-down). ``since`` is where the current
state's counting starts (the window never reaches back past the last close; a half-open breaker judges
only what ended after it went half-open). A row is created the first time a handler's window is evaluated.

``executions.held_by`` names the breaker holding a scheduled retry: the execution keeps its failed state and
its attempt number, ``next_attempt_at`` is pushed out to the breaker's next probe, and closing the breaker
releases it (``executions_held_idx``). ``jobs.breaker`` and ``tenants.breaker`` carry the per-job and
per-tenant settings (NULL: the defaults).
"""

from sundial_common.stores.schema import run_sql_script

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
    ALTER TABLE tenants ADD COLUMN breaker jsonb;
    ALTER TABLE jobs ADD COLUMN breaker jsonb;
    ALTER TABLE executions ADD COLUMN held_by uuid;
    CREATE INDEX executions_held_idx ON executions (held_by) WHERE held_by IS NOT NULL;

    CREATE TABLE breakers (
        id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
        tenant_id       text NOT NULL REFERENCES tenants (id),
        pool            text NOT NULL,
        handler         text NOT NULL,
        state           text NOT NULL DEFAULT 'CLOSED' CHECK (state IN ('CLOSED', 'OPEN', 'HALF_OPEN')),
        since           timestamptz NOT NULL DEFAULT now(),
        -- What the window counts had already recorded in the second of ``since`` when the state began:
        -- subtracted, so a state judges only what ended after it began (buckets are whole seconds).
        since_attempts  integer NOT NULL DEFAULT 0,
        since_failures  integer NOT NULL DEFAULT 0,
        attempts        integer NOT NULL DEFAULT 0,
        failures        integer NOT NULL DEFAULT 0,
        opened_at       timestamptz,
        next_probe_at   timestamptz,
        cooldown_sec    double precision NOT NULL DEFAULT 0,
        probe_limit     integer NOT NULL DEFAULT 0,
        probes_sent     integer NOT NULL DEFAULT 0,
        opens           integer NOT NULL DEFAULT 0,
        manual          boolean NOT NULL DEFAULT false,
        version         bigint NOT NULL DEFAULT 1,
        updated_at      timestamptz NOT NULL DEFAULT now(),
        CONSTRAINT breakers_handler_key UNIQUE (tenant_id, pool, handler)
    );

    CREATE TABLE breaker_counts (
        tenant_id   text NOT NULL,
        pool        text NOT NULL,
        handler     text NOT NULL,
        bucket      timestamptz NOT NULL,
        slot        smallint NOT NULL,
        attempts    integer NOT NULL,
        failures    integer NOT NULL,
        PRIMARY KEY (tenant_id, pool, handler, bucket, slot)
    );
    ALTER TABLE breaker_counts SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000);

    CREATE FUNCTION breaker_counts_attempts() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO breaker_counts AS c (tenant_id, pool, handler, bucket, slot, attempts, failures)
        SELECT n.tenant_id, n.pool, n.handler, date_trunc('second', now()), pg_backend_pid() % 8,
               count(*), count(*) FILTER (WHERE n.state <> 'SUCCEEDED')
        FROM new_rows n
        -- An attempt ended in this statement's transaction: whoever ends one stamps finished_at = now() (no
        -- join with the old rows needed). FAILED_WORKER_LOST is the worker's failure, not the handler's: a
        -- killed worker must not open its handlers' breakers (it counts neither way).
        WHERE n.finished_at = now() AND n.state IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'DEAD')
        GROUP BY n.tenant_id, n.pool, n.handler
        -- One order for every writer: two statements never wait on each other's rows in opposite orders.
        ORDER BY n.tenant_id, n.pool, n.handler
        ON CONFLICT (tenant_id, pool, handler, bucket, slot) DO UPDATE
            SET attempts = c.attempts + EXCLUDED.attempts, failures = c.failures + EXCLUDED.failures;
        RETURN NULL;
    END $$;
    CREATE TRIGGER executions_breaker_counts AFTER UPDATE ON executions
        REFERENCING NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION breaker_counts_attempts();

    ALTER TABLE audit_log DROP CONSTRAINT audit_log_entity_check;
    ALTER TABLE audit_log ADD CONSTRAINT audit_log_entity_check CHECK (entity IN ('job', 'execution', 'breaker'));
    """
    )


def downgrade() -> None:
    run_sql_script(
        """
    DROP TRIGGER executions_breaker_counts ON executions;
    DROP FUNCTION breaker_counts_attempts();
    DROP TABLE breaker_counts, breakers;
    DROP INDEX executions_held_idx;
    ALTER TABLE executions DROP COLUMN held_by;
    ALTER TABLE jobs DROP COLUMN breaker;
    ALTER TABLE tenants DROP COLUMN breaker;
    """
    )
