"""executions and execution_attempts partitioned by day of their id, so retention drops whole days.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-24

Until now retention deleted finished executions row by row (the analytics service, 5,000 per statement):
at 5,000 executions a second that is 432 M rows a day to delete, each leaving dead tuples and index entries
for vacuum — as much write work again as creating them. Partitioned, an expired day is one ``DROP TABLE``.

**The partition key is the execution id** (a UUIDv7: its first 48 bits are the millisecond it was minted, at
dispatch), ranged per UTC day: ``[sundial_id_floor(day), sundial_id_floor(day + 1))``. The primary key stays
``(id)`` and every lookup by id — the worker's start and finish batches, progress, the sweeper's ends, the
API's reads and cancels — is pruned to one partition (plan time for a constant, run time for each row of an
``unnest`` join), with no new argument anywhere. ``execution_attempts`` is ranged the same way on
``execution_id``, so an execution and its attempts always live (and are dropped) together. (A batch's join is
pruned at run time; it is still planned over every partition: see executions.sql.)

What partitioning by id costs: a unique index of a partitioned table must contain the partition key, so the
occurrence key ``(job_id, scheduled_for)`` and the trigger key ``(job_id, trigger_id)`` become *per-partition*
unique indexes (``sundial_add_execution_partitions`` makes them with each partition), and the inserts use ``ON
CONFLICT DO NOTHING`` without a target (every unique index of the partition a row lands in is an arbiter).
They still reject a second execution of an occurrence created the same UTC day; across days the guards are
the ones in front of them: a dispatch locks the job row and compare-and-sets its next fire (so two leaders
never both dispatch an occurrence), a backfill reads which nominal times already have an execution before
inserting (``existing_occurrences``, every partition's occurrence index), a trigger is consumed under its row
lock. Partitioning by ``scheduled_for`` instead would have kept the occurrence key global, but every lookup by
id would then probe every partition's primary key (30+ with the default retention), on the hottest path.

**Daily partitions**: a steady 5,000 a second is 432 M executions a day; a monthly partition would hold 13 G rows
and could only go once its last day expired. Days keep each partition's indexes small and let retention
follow the setting to the day. ``SUNDIAL_EXECUTION_RETENTION_DAYS`` (30) means ~40 partitions of each table.

**Upgrade in place**: the existing tables are attached as one partition each (``executions_legacy``,
``execution_attempts_legacy``) covering every id below tomorrow (UTC; or the day after the newest id) — when they
hold rows; an empty database simply drops them and starts with daily partitions only. No row is copied, their
indexes are adopted by the partitioned ones (same definitions), and the attach validates the bound with one scan.
Their occurrence and trigger keys stay as they are (local unique indexes, like every new partition's). Days from
tomorrow get daily partitions, a week ahead (the sweeper's ``partitions`` loop then keeps a week ahead and drops
expired days, :mod:`sundial_sweeper.partitions`). The legacy partition is dropped like any other once its newest
day is past retention and nothing in it is open. ``execution_attempts``' foreign key to ``executions`` goes (a
foreign key to a partitioned table would make every partition drop check it; attempts are written only by the
statements that move their execution, in the same statement) and so does the RI probe it cost each started attempt.
The triggers of 0010, 0015 and 0016 move to the partitioned table (statement triggers with transition tables see
the rows of every partition).

**Down**: the rows are copied back into plain tables with the indexes, keys and triggers of 0017.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

# Indexes the partitioned executions table carries on every partition (the names of 0001–0016).
_EXECUTION_INDEXES = """
    CREATE INDEX executions_open_idx ON executions (state, created_at) WHERE state IN ('PENDING', 'RUNNING');
    CREATE INDEX executions_retry_idx ON executions (shard, next_attempt_at, id) WHERE next_attempt_at IS NOT NULL;
    CREATE INDEX executions_dlq_outbox_idx ON executions (finished_at)
        WHERE state = 'DEAD' AND dlq_published_at IS NULL;
    CREATE INDEX executions_tenant_state_idx ON executions (tenant_id, state, id);
    CREATE INDEX executions_trace_idx ON executions (trace_id);
    CREATE INDEX executions_job_open_idx ON executions (job_id) WHERE state IN ('PENDING', 'RUNNING');
    CREATE INDEX executions_held_idx ON executions (held_by) WHERE held_by IS NOT NULL;
    CREATE INDEX executions_backfill_idx ON executions (backfill_id, state) WHERE backfill_id IS NOT NULL;
"""

_TRIGGERS = """
    CREATE TRIGGER executions_events_created AFTER INSERT ON executions
        REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION execution_events_created();
    CREATE TRIGGER executions_events_changed AFTER UPDATE ON executions
        REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION execution_events_changed();
    CREATE TRIGGER executions_dependency_triggers AFTER UPDATE ON executions
        REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION job_triggers_on_final();
    CREATE TRIGGER executions_breaker_counts AFTER UPDATE ON executions
        REFERENCING NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION breaker_counts_attempts();
"""

_DROP_TRIGGERS = """
    DROP TRIGGER executions_events_created ON {table};
    DROP TRIGGER executions_events_changed ON {table};
    DROP TRIGGER executions_dependency_triggers ON {table};
    DROP TRIGGER executions_breaker_counts ON {table};
"""

# The secondary index names of 0001–0016, renamed on the legacy table to free them for the partitioned ones.
_LEGACY_INDEXES = (
    "pkey",
    "open_idx",
    "retry_idx",
    "dlq_outbox_idx",
    "tenant_state_idx",
    "trace_idx",
    "job_open_idx",
    "held_idx",
    "backfill_idx",
    "occurrence_key",
    "trigger_key",
)


def upgrade() -> None:
    renames = "\n".join(
        f"    ALTER INDEX executions_{name} RENAME TO executions_legacy_{name};" for name in _LEGACY_INDEXES
    )
    run_sql_script(
        f"""
    -- The smallest UUIDv7 of an instant's millisecond (sundial_common.domain.ids.id_floor): every id minted from that
    -- millisecond on sorts at or above it. Immutable: the epoch of a timestamptz does not depend on TimeZone.
    CREATE FUNCTION sundial_id_floor(at timestamptz) RETURNS uuid LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
        SELECT (lpad(to_hex(floor(extract(epoch FROM at) * 1000)::bigint), 12, '0') || '70008000000000000000')::uuid
    $$;

    -- The partitions of `days` UTC days from `first_day` that do not exist yet (executions_pYYYYMMDD and
    -- execution_attempts_pYYYYMMDD, with the per-partition occurrence and trigger keys); how many it made.
    -- A day the legacy partition (partly) covers is skipped: its executions are still created there.
    CREATE FUNCTION sundial_add_execution_partitions(first_day date, days integer) RETURNS integer
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
                EXECUTE format('CREATE TABLE %I PARTITION OF executions FOR VALUES FROM (%L) TO (%L)', part, low, high);
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

    -- Drop one expired day (both tables), unless it still holds what must outlive retention: an open execution
    -- (PENDING, RUNNING, a retry scheduled or held by a breaker), a dead letter not yet published to
    -- sundial.dlq, or lifecycle events not yet replicated to ClickHouse. Locks both parents first (a partition
    -- drop needs its parent exclusively; taking them up front cannot deadlock with a writer that holds one
    -- and waits for the other): the caller bounds the wait with lock_timeout. True if it dropped the day.
    CREATE FUNCTION sundial_drop_execution_partition(part text) RETURNS boolean LANGUAGE plpgsql AS $$
    DECLARE
        bound   text;
        low     uuid;
        high    uuid;
    BEGIN
        LOCK TABLE executions, execution_attempts IN ACCESS EXCLUSIVE MODE;
        SELECT pg_get_expr(c.relpartbound, c.oid) INTO bound
        FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid
        WHERE c.relname = part AND i.inhparent = 'executions'::regclass;
        IF bound IS NULL THEN
            RETURN false;
        END IF;
        low := coalesce(substring(bound FROM 'FROM \\(''([0-9a-f-]+)''\\)')::uuid,
                        '00000000-0000-0000-0000-000000000000');  -- MINVALUE: the legacy partition
        high := substring(bound FROM 'TO \\(''([0-9a-f-]+)''\\)')::uuid;
        PERFORM 1 FROM executions e
        WHERE e.id >= low AND e.id < high
          AND (e.state IN ('PENDING', 'RUNNING') OR e.next_attempt_at IS NOT NULL
               OR (e.state = 'DEAD' AND e.dlq_published_at IS NULL))
        LIMIT 1;
        IF FOUND THEN
            RETURN false;
        END IF;
        PERFORM 1 FROM execution_events v WHERE v.execution_id >= low AND v.execution_id < high LIMIT 1;
        IF FOUND THEN
            RETURN false;
        END IF;
        EXECUTE format('DROP TABLE IF EXISTS %I', 'execution_attempts' || substring(part FROM 11));
        EXECUTE format('DROP TABLE %I', part);
        RETURN true;
    END $$;

    ALTER TABLE executions RENAME TO executions_legacy;
    ALTER TABLE execution_attempts RENAME TO execution_attempts_legacy;
{renames}
    ALTER INDEX execution_attempts_pkey RENAME TO execution_attempts_legacy_pkey;
    ALTER TABLE execution_attempts_legacy DROP CONSTRAINT execution_attempts_execution_id_fkey;
    {_DROP_TRIGGERS.format(table="executions_legacy")}

    CREATE TABLE executions (LIKE executions_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
        PARTITION BY RANGE (id);
    ALTER TABLE executions ADD CONSTRAINT executions_pkey PRIMARY KEY (id),
        ADD CONSTRAINT executions_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES tenants (id),
        ADD CONSTRAINT executions_job_id_fkey FOREIGN KEY (job_id) REFERENCES jobs (id);
    {_EXECUTION_INDEXES}
    CREATE TABLE execution_attempts (LIKE execution_attempts_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
        PARTITION BY RANGE (execution_id);
    ALTER TABLE execution_attempts ADD CONSTRAINT execution_attempts_pkey PRIMARY KEY (execution_id, attempt),
        ADD CONSTRAINT execution_attempts_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES tenants (id);

    DO $$
    DECLARE
        newest  timestamptz;
        bound   uuid;
    BEGIN
        -- A new database (or one that never ran anything) starts with daily partitions only.
        IF NOT EXISTS (SELECT 1 FROM executions_legacy) AND NOT EXISTS (SELECT 1 FROM execution_attempts_legacy) THEN
            DROP TABLE execution_attempts_legacy, executions_legacy;
            RETURN;
        END IF;
        -- Up to the end of today, or of the day of the newest id if one was minted later (a clock ahead, or a
        -- database downgraded and upgraded again): the bound must hold every row.
        SELECT greatest(now(), to_timestamp(('x' || left(replace(id::text, '-', ''), 12))::bit(48)::bigint / 1000.0))
        INTO newest FROM (SELECT id FROM executions_legacy ORDER BY id DESC LIMIT 1) newest_id;
        IF newest > now() + interval '1 year' THEN
            RAISE EXCEPTION 'executions holds ids minted after %, not UUIDv7s of their creation: '
                'cannot range it by day', now() + interval '1 year';
        END IF;
        bound := sundial_id_floor(((newest AT TIME ZONE 'UTC')::date + 1)::timestamp AT TIME ZONE 'UTC');
        EXECUTE format('ALTER TABLE executions ATTACH PARTITION executions_legacy FOR VALUES FROM (MINVALUE) TO (%L)',
                       bound);
        EXECUTE format('ALTER TABLE execution_attempts ATTACH PARTITION execution_attempts_legacy'
                       ' FOR VALUES FROM (MINVALUE) TO (%L)', bound);
    END $$;
    SELECT sundial_add_execution_partitions((now() AT TIME ZONE 'UTC')::date, 8);
    {_TRIGGERS}
    """
    )


def downgrade() -> None:
    run_sql_script(
        f"""
    CREATE TABLE executions_flat (LIKE executions INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
    INSERT INTO executions_flat SELECT * FROM executions;
    CREATE TABLE execution_attempts_flat (LIKE execution_attempts INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
    INSERT INTO execution_attempts_flat SELECT * FROM execution_attempts;
    DROP TABLE execution_attempts, executions;
    DROP FUNCTION sundial_drop_execution_partition(text);
    DROP FUNCTION sundial_add_execution_partitions(date, integer);
    DROP FUNCTION sundial_id_floor(timestamptz);
    ALTER TABLE executions_flat RENAME TO executions;
    ALTER TABLE execution_attempts_flat RENAME TO execution_attempts;
    ALTER TABLE executions ADD CONSTRAINT executions_pkey PRIMARY KEY (id),
        ADD CONSTRAINT executions_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES tenants (id),
        ADD CONSTRAINT executions_job_id_fkey FOREIGN KEY (job_id) REFERENCES jobs (id),
        ADD CONSTRAINT executions_occurrence_key UNIQUE (job_id, scheduled_for);
    CREATE UNIQUE INDEX executions_trigger_key ON executions (job_id, trigger_id) WHERE trigger_id IS NOT NULL;
    {_EXECUTION_INDEXES}
    ALTER TABLE execution_attempts ADD CONSTRAINT execution_attempts_pkey PRIMARY KEY (execution_id, attempt),
        ADD CONSTRAINT execution_attempts_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES tenants (id),
        ADD CONSTRAINT execution_attempts_execution_id_fkey FOREIGN KEY (execution_id) REFERENCES executions (id);
    {_TRIGGERS}
    """
    )
