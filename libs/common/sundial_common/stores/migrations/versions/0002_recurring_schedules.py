"""recurring schedules: schema for cron, interval and run-list jobs.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21

Jobs gain the rest of their schedule (interval, run list, bounds, jitter), their overlap and catch-up
policies, the nominal time of their next occurrence beside the jittered one (``next_fire_at`` stays the
instant the hot window and the hydrator work with), a pending manual trigger, and a count of missed fires.
Executions record when they were due to fire after jitter (``scheduled_for`` stays the nominal occurrence
and keeps its uniqueness), whether they were triggered by hand, and a cancellation request (the overlap
policy CANCEL_RUNNING sets it; the worker honours it).

Every column added to ``jobs`` is nullable or has a constant default, so on a large table this is a
catalogue change, not a rewrite.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
    ALTER TABLE jobs
        ADD COLUMN interval_sec         integer CHECK (interval_sec >= 1),
        ADD COLUMN run_list             timestamptz[],
        ADD COLUMN start_at             timestamptz,
        ADD COLUMN end_at               timestamptz,
        ADD COLUMN max_runs             integer CHECK (max_runs >= 1),
        ADD COLUMN jitter_sec           integer NOT NULL DEFAULT 0 CHECK (jitter_sec >= 0),
        ADD COLUMN overlap_policy       text NOT NULL DEFAULT 'ALLOW'
            CHECK (overlap_policy IN ('ALLOW', 'SKIP', 'BUFFER_ONE', 'CANCEL_RUNNING')),
        ADD COLUMN catchup_policy       text NOT NULL DEFAULT 'FIRE_ONCE'
            CHECK (catchup_policy IN ('FIRE_ONCE', 'FIRE_ALL', 'SKIP')),
        ADD COLUMN catchup_window_sec   integer NOT NULL DEFAULT 60 CHECK (catchup_window_sec >= 1),
        -- The next occurrence's nominal instant; next_fire_at is the same plus this occurrence's jitter.
        ADD COLUMN next_nominal_at      timestamptz,
        -- Occurrences that passed beyond the catch-up window without a run of their own.
        ADD COLUMN missed_fires         bigint NOT NULL DEFAULT 0,
        -- POST /v1/jobs/{id}/trigger: one run now, created by the dispatcher with this id.
        ADD COLUMN trigger_at           timestamptz,
        ADD COLUMN trigger_execution_id uuid;

    -- The hydrator's recovery scan for triggers whose hot-window member was lost. Almost always empty.
    CREATE INDEX jobs_trigger_idx ON jobs (shard, trigger_at) WHERE trigger_at IS NOT NULL;

    ALTER TABLE executions
        -- When the occurrence was due to fire: scheduled_for (nominal) plus the job's jitter.
        ADD COLUMN fire_at              timestamptz,
        ADD COLUMN triggered            boolean NOT NULL DEFAULT false,
        ADD COLUMN cancel_requested_at  timestamptz;

    -- The overlap check in the dispatch transaction: is a job's previous execution still open?
    CREATE INDEX executions_job_open_idx ON executions (job_id) WHERE state IN ('PENDING', 'RUNNING');
    """
    )


def downgrade() -> None:
    run_sql_script(
        """
    DROP INDEX executions_job_open_idx;
    ALTER TABLE executions DROP COLUMN fire_at, DROP COLUMN triggered, DROP COLUMN cancel_requested_at;
    DROP INDEX jobs_trigger_idx;
    ALTER TABLE jobs
        DROP COLUMN interval_sec, DROP COLUMN run_list, DROP COLUMN start_at, DROP COLUMN end_at,
        DROP COLUMN max_runs, DROP COLUMN jitter_sec, DROP COLUMN overlap_policy, DROP COLUMN catchup_policy,
        DROP COLUMN catchup_window_sec, DROP COLUMN next_nominal_at, DROP COLUMN missed_fires,
        DROP COLUMN trigger_at, DROP COLUMN trigger_execution_id;
    """
    )
