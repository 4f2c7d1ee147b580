"""replays: re-publishing a window of a pool's Kafka messages into a staging pool, and what staging ran.

Revision ID: 0008
Revises: 0005
Create Date: 2026-11-23

``replays`` is one request (``POST /v1/replays``) and its lifecycle (PENDING → RUNNING → SUCCEEDED | FAILED |
CANCELLED) with its counters; ``replay_partitions`` is its progress per source partition: the offsets the
window resolved to and ``next_offset``, the first offset not yet re-published. The replayer commits a
partition's ``next_offset`` and the counters in one statement after each published batch, so a killed
replayer resumes from there (the batch in flight at the kill is published again: at-least-once).

``replay_runs`` is what a staging worker did with a replayed message: one row per original message
(replay, source partition and offset), ``deliveries`` counting how often it arrived (duplicates after a
resume), outcome, error and duration. Staging runs never touch ``executions``.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
    CREATE TABLE replays (
        id                  uuid PRIMARY KEY,
        -- The tenant whose token asked for it (it sees the replay); filter_tenant_id is whose messages it replays.
        tenant_id           text NOT NULL,
        created_by          text NOT NULL,
        source_pool         text NOT NULL,
        target_pool         text NOT NULL,
        window_from         timestamptz NOT NULL,
        window_to           timestamptz NOT NULL,
        filter_handler      text,
        filter_job_id       uuid,
        filter_tenant_id    text,
        rate_per_sec        integer,
        dry_run             boolean NOT NULL DEFAULT false,
        state               text NOT NULL DEFAULT 'PENDING'
                            CHECK (state IN ('PENDING', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED')),
        scanned             bigint NOT NULL DEFAULT 0,
        matched             bigint NOT NULL DEFAULT 0,
        published           bigint NOT NULL DEFAULT 0,
        -- How many times the replayer resumed it after its previous holder stopped mid-way.
        resumes             integer NOT NULL DEFAULT 0,
        cancel_requested_at timestamptz,
        error               text,
        created_at          timestamptz NOT NULL DEFAULT now(),
        started_at          timestamptz,
        finished_at         timestamptz,
        updated_at          timestamptz NOT NULL DEFAULT now(),
        CHECK (window_from < window_to)
    );
    -- GET /v1/replays: a tenant's replays newest first (ids are UUIDv7).
    CREATE INDEX replays_tenant_idx ON replays (tenant_id, id);
    -- The replayer's scan of work to do (tiny: only unfinished replays are in it).
    CREATE INDEX replays_active_idx ON replays (id) WHERE state IN ('PENDING', 'RUNNING');

    CREATE TABLE replay_partitions (
        replay_id     uuid NOT NULL REFERENCES replays (id) ON DELETE CASCADE,
        partition     integer NOT NULL,
        start_offset  bigint NOT NULL,
        -- NULL until found by reading (a broker without a time index, such as Tansu, answers no offsets for
        -- times): the first message at or after the window's end, or the partition's end.
        end_offset    bigint,
        next_offset   bigint NOT NULL,
        scanned       bigint NOT NULL DEFAULT 0,
        matched       bigint NOT NULL DEFAULT 0,
        published     bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (replay_id, partition)
    );

    CREATE TABLE replay_runs (
        replay_id              uuid NOT NULL REFERENCES replays (id) ON DELETE CASCADE,
        source_partition       integer NOT NULL,
        source_offset          bigint NOT NULL,
        original_execution_id  uuid NOT NULL,
        handler                text NOT NULL,
        outcome                text NOT NULL CHECK (outcome IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT')),
        error                  text,
        duration_ms            double precision NOT NULL,
        worker_id              text NOT NULL,
        deliveries             integer NOT NULL DEFAULT 1,
        recorded_at            timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (replay_id, source_partition, source_offset)
    );
    """
    )


def downgrade() -> None:
    run_sql_script("DROP TABLE replay_runs; DROP TABLE replay_partitions; DROP TABLE replays;")
