"""executions.phase: no index names ``state`` any more, so a start (PENDING -> RUNNING) is a heap-only update.

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-26

Until now ``state`` was in five indexes of ``executions`` (the open-state partial indexes' predicates, the
tenant listing's and the backfill count's keys, the dead-letter outbox's predicate). A change to any column an
index names (key, expression or predicate) makes an update write a new entry into *every* index of the table:
the worker's start and finish each added six B-tree entries (pkey, occurrence key, tenant, trace, the two open
ones), 16 an execution with the insert's, and B-tree inserts were a third of the Postgres backends' CPU
(bench/workloads/storage.py).

No reader needs an index to tell PENDING from RUNNING: the dispatcher's census and the sweeper's scans read every
open row and tell them apart on the heap, an open listing is short. So the indexes name a generated column
instead: ``phase`` is ``'OPEN'`` while the execution is PENDING or RUNNING, its state otherwise. A start leaves
``phase`` (and every other indexed column) as it was, so PostgreSQL writes the new version on the same heap page
without touching an index (HOT), if the page has room: the partitions are filled to ``fillfactor`` 50 by inserts,
which leaves each row's started version a place beside it. A finish still changes ``phase`` (the row leaves the
open indexes) and adds its four entries. An execution now writes 10 index entries instead of 16, and the open
indexes keep no dead entry of a start for the census to step over (database.sql, ``every_partition_plan``).

Each index keeps its name and its readers, with ``phase`` where it had ``state``:

* ``executions_open_idx (created_at) WHERE phase = 'OPEN'``: the census, the sweeper's RUNNING keyset
  (``running_executions``), the stale and republished PENDING scans, a restarted worker's orphans.
* ``executions_job_open_idx (job_id) WHERE phase = 'OPEN'``: a job's open executions (overlap policies).
* ``executions_tenant_phase_idx (tenant_id, phase, id)`` (was ``tenant_state_idx``): the API's listing by state,
  the sweeper's DEAD count per tenant.
* ``executions_dlq_outbox_idx (finished_at) WHERE phase = 'DEAD' AND dlq_published_at IS NULL``: the dead-letter
  outbox.
* ``executions_backfill_idx (backfill_id, phase) WHERE backfill_id IS NOT NULL``: a backfill's progress.

Adding a stored generated column rewrites every partition once (under an exclusive lock). Partitions made from
now on are created with the fillfactor (``sundial_add_execution_partitions``; PostgreSQL 15 keeps storage
parameters on partitions only); the existing ones get it for the pages they add.

**Down**: the indexes of 0022 come back, ``phase`` goes, the partitions return to the default fillfactor.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

#: Heap pages of a partition are filled to this by inserts; the rest is room for the rows' started versions.
FILLFACTOR = 50

# 0018's function, with a storage clause for the new executions partitions.
_ADD_PARTITIONS = """
    CREATE OR REPLACE FUNCTION sundial_add_execution_partitions(first_day date, days integer) RETURNS integer
    LANGUAGE plpgsql AS $$
    DECLARE
        day     date;
        part    text;
        low     uuid;
        high    uuid;
        made    integer := 0;
    BEGIN
        FOR i IN 0 .. days - 1 LOOP
            day := first_day + i;
            part := 'executions_p' || to_char(day, 'YYYYMMDD');
            CONTINUE WHEN to_regclass(part) IS NOT NULL;
            low := sundial_id_floor(day::timestamp AT TIME ZONE 'UTC');
            high := sundial_id_floor((day + 1)::timestamp AT TIME ZONE 'UTC');
            BEGIN
                EXECUTE format('CREATE TABLE %I PARTITION OF executions FOR VALUES FROM (%L) TO (%L){storage}',
                               part, low, high);
            EXCEPTION WHEN invalid_object_definition THEN
                CONTINUE;  -- "would overlap partition executions_legacy"
            END;
            EXECUTE format('CREATE UNIQUE INDEX %I ON %I (job_id, scheduled_for)', part || '_occurrence_key', part);
            EXECUTE format('CREATE UNIQUE INDEX %I ON %I (job_id, trigger_id) WHERE trigger_id IS NOT NULL',
                           part || '_trigger_key', part);
            EXECUTE format('CREATE TABLE %I PARTITION OF execution_attempts FOR VALUES FROM (%L) TO (%L)',
                           'execution_attempts_p' || to_char(day, 'YYYYMMDD'), low, high);
            made := made + 1;
        END LOOP;
        RETURN made;
    END $$;
"""

# Sets (or resets) a storage parameter on every partition of executions.
_EACH_PARTITION = """
    DO $$
    DECLARE
        part regclass;
    BEGIN
        FOR part IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'executions'::regclass LOOP
            EXECUTE format('ALTER TABLE %s {action}', part);
        END LOOP;
    END $$;
"""

_STATE_INDEXES = """
    CREATE INDEX executions_open_idx ON executions (state, created_at) WHERE state IN ('PENDING', 'RUNNING');
    CREATE INDEX executions_job_open_idx ON executions (job_id) WHERE state IN ('PENDING', 'RUNNING');
    CREATE INDEX executions_tenant_state_idx ON executions (tenant_id, state, id);
    CREATE INDEX executions_dlq_outbox_idx ON executions (finished_at)
        WHERE state = 'DEAD' AND dlq_published_at IS NULL;
    CREATE INDEX executions_backfill_idx ON executions (backfill_id, state) WHERE backfill_id IS NOT NULL;
"""

_PHASE_INDEXES = """
    CREATE INDEX executions_open_idx ON executions (created_at) WHERE phase = 'OPEN';
    CREATE INDEX executions_job_open_idx ON executions (job_id) WHERE phase = 'OPEN';
    CREATE INDEX executions_tenant_phase_idx ON executions (tenant_id, phase, id);
    CREATE INDEX executions_dlq_outbox_idx ON executions (finished_at)
        WHERE phase = 'DEAD' AND dlq_published_at IS NULL;
    CREATE INDEX executions_backfill_idx ON executions (backfill_id, phase) WHERE backfill_id IS NOT NULL;
"""

_DROP_INDEXES = """
    DROP INDEX executions_open_idx, executions_job_open_idx, {tenant}, executions_dlq_outbox_idx,
        executions_backfill_idx;
"""


def upgrade() -> None:
    fillfactor = f"fillfactor = {FILLFACTOR}"
    run_sql_script(
        f"""
    {_DROP_INDEXES.format(tenant="executions_tenant_state_idx")}
    ALTER TABLE executions ADD COLUMN phase text NOT NULL
        GENERATED ALWAYS AS (CASE WHEN state IN ('PENDING', 'RUNNING') THEN 'OPEN' ELSE state END) STORED;
    {_PHASE_INDEXES}
    {_ADD_PARTITIONS.format(storage=f" WITH ({fillfactor})")}
    {_EACH_PARTITION.format(action=f"SET ({fillfactor})")}
    """
    )


def downgrade() -> None:
    run_sql_script(
        f"""
    {_EACH_PARTITION.format(action="RESET (fillfactor)")}
    {_ADD_PARTITIONS.format(storage="")}
    {_DROP_INDEXES.format(tenant="executions_tenant_phase_idx")}
    ALTER TABLE executions DROP COLUMN phase;
    {_STATE_INDEXES}
    """
    )
