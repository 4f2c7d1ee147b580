"""audit_log partitioned by day of its ``at``, so its retention drops whole days.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-26

Every execution writes three audit rows (``dispatch``, ``start``, ``finish``) and nothing ever removed one: at a
steady 2,500 executions a second that is 650 M rows a day, and the table only grew. 0018 gave executions a
retention that drops days; the audit log now gets its own (``SUNDIAL_AUDIT_RETENTION_DAYS``, the sweeper's
partition loop, :mod:`sundial_sweeper.partitions`), dropping a whole day with one ``DROP TABLE``: no row is
updated or deleted, so the log stays append-only (the trigger still refuses both, on every partition).

**The partition key is ``at``** (the writing transaction's start), ranged per UTC day
(``audit_log_pYYYYMMDD``). Nothing reads the log by time or by id alone: a trail is read by
``(entity_id, id)`` (``audit_entity_idx``, on every partition; a trail's rows are spread over the days it lived,
so each read probes each partition's index). The primary key becomes ``(id, at)`` (a unique key of a
partitioned table must hold the partition key); ``id`` still comes from one sequence, so the keyset paging of
``GET …/audit`` (``id > cursor``) is unchanged. There is no default partition, as for executions: the loop makes
``SUNDIAL_PARTITIONS_AHEAD_DAYS`` ahead, and the migration a week.

**Upgrade in place**: the existing table becomes the ``audit_log_legacy`` partition (every ``at`` before
tomorrow, UTC, or after its newest row) when it holds rows; an empty database drops it and starts with daily
partitions. No row is copied; its key becomes ``(id, at)`` (one pass over the table to build it) and the attach
validates the bound with one scan. The legacy partition is dropped like any day once its newest row is past
retention. The identity column becomes a plain sequence default (``audit_log_id_seq``, continuing after the
legacy's largest id): PostgreSQL 15 has no identity columns on partitioned tables.

**Down**: the rows are copied back into a plain table with 0019's key, index, identity and trigger.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_APPEND_ONLY = """
    CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
        FOR EACH ROW EXECUTE FUNCTION audit_log_is_append_only();
"""


def upgrade() -> None:
    run_sql_script(
        f"""
    -- The partitions of `days` UTC days from `first_day` that do not exist yet (audit_log_pYYYYMMDD); how many it
    -- made. A day the legacy partition (partly) covers is skipped: its rows are still written there.
    CREATE FUNCTION sundial_add_audit_partitions(first_day date, days integer) RETURNS integer
    LANGUAGE plpgsql AS $$
    DECLARE
        day     date;
        part    text;
        made    integer := 0;
    BEGIN
        FOR i IN 0 .. days - 1 LOOP
            day := first_day + i;
            part := 'audit_log_p' || to_char(day, 'YYYYMMDD');
            CONTINUE WHEN to_regclass(part) IS NOT NULL;
            BEGIN
                EXECUTE format('CREATE TABLE %I PARTITION OF audit_log FOR VALUES FROM (%L) TO (%L)', part,
                               day::timestamp AT TIME ZONE 'UTC', (day + 1)::timestamp AT TIME ZONE 'UTC');
            EXCEPTION WHEN invalid_object_definition THEN
                CONTINUE;  -- "would overlap partition audit_log_legacy"
            END;
            made := made + 1;
        END LOOP;
        RETURN made;
    END $$;

    -- Drop one partition of audit_log (the caller decided it is past retention; nothing else must outlive it).
    -- Locks the parent first (a partition's drop needs it exclusively): the caller bounds the wait with
    -- lock_timeout. True if it dropped it; false if it is not a partition of audit_log.
    CREATE FUNCTION sundial_drop_audit_partition(part text) RETURNS boolean LANGUAGE plpgsql AS $$
    BEGIN
        LOCK TABLE audit_log IN ACCESS EXCLUSIVE MODE;
        PERFORM 1 FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid
        WHERE c.relname = part AND i.inhparent = 'audit_log'::regclass;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
        EXECUTE format('DROP TABLE %I', part);
        RETURN true;
    END $$;

    ALTER TABLE audit_log RENAME TO audit_log_legacy;
    -- The partitions' key is (id, at): the legacy table gets it before it is attached (one pass over it).
    ALTER TABLE audit_log_legacy DROP CONSTRAINT audit_log_pkey,
        ADD CONSTRAINT audit_log_legacy_pkey PRIMARY KEY (id, at);
    ALTER INDEX audit_entity_idx RENAME TO audit_log_legacy_entity_idx;
    DROP TRIGGER audit_log_append_only ON audit_log_legacy;
    ALTER TABLE audit_log_legacy ALTER COLUMN id DROP IDENTITY;

    CREATE TABLE audit_log (LIKE audit_log_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (at);
    CREATE SEQUENCE audit_log_id_seq AS bigint OWNED BY audit_log.id;
    SELECT setval('audit_log_id_seq', max(id)) FROM audit_log_legacy HAVING max(id) IS NOT NULL;
    ALTER TABLE audit_log ALTER COLUMN id SET DEFAULT nextval('audit_log_id_seq'),
        ADD CONSTRAINT audit_log_pkey PRIMARY KEY (id, at);
    CREATE INDEX audit_entity_idx ON audit_log (entity_id, id);
    {_APPEND_ONLY}

    DO $$
    DECLARE
        newest  timestamptz;
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM audit_log_legacy) THEN
            DROP TABLE audit_log_legacy;
            RETURN;
        END IF;
        -- Up to the end of today, or of the day of the newest row if one is dated later: the bound must hold
        -- every row.
        SELECT greatest(now(), max(at)) INTO newest FROM audit_log_legacy;
        EXECUTE format('ALTER TABLE audit_log ATTACH PARTITION audit_log_legacy FOR VALUES FROM (MINVALUE) TO (%L)',
                       ((newest AT TIME ZONE 'UTC')::date + 1)::timestamp AT TIME ZONE 'UTC');
    END $$;
    SELECT sundial_add_audit_partitions((now() AT TIME ZONE 'UTC')::date, 8);
    """
    )


def downgrade() -> None:
    run_sql_script(
        f"""
    CREATE TABLE audit_log_flat (LIKE audit_log INCLUDING CONSTRAINTS);
    INSERT INTO audit_log_flat SELECT * FROM audit_log;
    DO $$
    DECLARE
        next_id bigint;
    BEGIN
        -- The identity goes on from the sequence, not from the rows kept: retention may have dropped the newest.
        SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END INTO next_id FROM audit_log_id_seq;
        DROP TABLE audit_log;
        ALTER TABLE audit_log_flat RENAME TO audit_log;
        EXECUTE format('ALTER TABLE audit_log ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (START WITH %s)',
                       next_id);
    END $$;
    DROP FUNCTION sundial_drop_audit_partition(text);
    DROP FUNCTION sundial_add_audit_partitions(date, integer);
    ALTER TABLE audit_log ALTER COLUMN at SET DEFAULT now(), ADD CONSTRAINT audit_log_pkey PRIMARY KEY (id);
    CREATE INDEX audit_entity_idx ON audit_log (entity_id, id);
    {_APPEND_ONLY}
    """
    )
