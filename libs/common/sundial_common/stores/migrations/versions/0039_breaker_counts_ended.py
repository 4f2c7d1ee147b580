"""breaker_counts_ended: the retry breaker counts the attempts a statement ends, whatever end they record.

Revision ID: 0039
Revises: 0038
Create Date: 2026-11-28

The window counts of the retry breaker (0016) are filled by a statement-level trigger on ``executions`` that
counted the rows a statement left with ``finished_at = now()``: every writer that ended an attempt stamped its end
with the transaction's time. A worker now records when each handler ended and writes its outcomes a few at a time,
so an attempt's end is no longer the transaction's: the trigger instead compares the statement's old and new rows
(``executions`` keeps both for its other triggers already) and counts the attempts moved out of RUNNING into an
ended state. The previous release's writers, which stamp ``now()`` and move attempts out of RUNNING alike, are
counted the same way, so both releases run on this schema. Each count still goes to the second of the
transaction's time.

The join runs with nested loops off: transition tables have no statistics, so the planner estimates each filtered
side at a row or so and joins them by a nested loop — 40,000 comparisons for a finish of 200 outcomes. Measured
on 500 updates of 200 rows each: 2.7–3.1 s with the nested loop, 0.95–1.24 s with a hash join, 0.88–1.04 s for the
old ``finished_at = now()`` filter.

**Down**: the trigger counts ``finished_at = now()`` again.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0039"
down_revision = "0038"
branch_labels = None
depends_on = None

_COUNT = """
    CREATE OR REPLACE FUNCTION breaker_counts_attempts() RETURNS trigger LANGUAGE plpgsql {options} AS $$
    BEGIN
        INSERT INTO breaker_counts AS c (tenant_id, pool, handler, bucket, slot, attempts, failures)
        SELECT n.tenant_id, n.pool, n.handler, date_trunc('second', now()), pg_backend_pid() % 8,
               count(*), count(*) FILTER (WHERE n.state <> 'SUCCEEDED')
        FROM {rows}
        -- FAILED_WORKER_LOST is the worker's failure, not the handler's: a killed worker must not open its
        -- handlers' breakers (it counts neither way).
        WHERE {ended} AND n.state IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'DEAD')
        GROUP BY n.tenant_id, n.pool, n.handler
        -- One order for every writer: two statements never wait on each other's rows in opposite orders.
        ORDER BY n.tenant_id, n.pool, n.handler
        ON CONFLICT (tenant_id, pool, handler, bucket, slot) DO UPDATE
            SET attempts = c.attempts + EXCLUDED.attempts, failures = c.failures + EXCLUDED.failures;
        RETURN NULL;
    END $$;
    DROP TRIGGER IF EXISTS executions_breaker_counts ON executions;
    CREATE TRIGGER executions_breaker_counts AFTER UPDATE ON executions
        REFERENCING {transition} FOR EACH STATEMENT EXECUTE FUNCTION breaker_counts_attempts();
"""


def upgrade() -> None:
    run_sql_script(
        _COUNT.format(
            rows="new_rows n JOIN old_rows o ON o.id = n.id",
            ended="o.state = 'RUNNING'",
            transition="OLD TABLE AS old_rows NEW TABLE AS new_rows",
            options="SET enable_nestloop = off",
        )
    )


def downgrade() -> None:
    run_sql_script(
        _COUNT.format(rows="new_rows n", ended="n.finished_at = now()", transition="NEW TABLE AS new_rows", options="")
    )
