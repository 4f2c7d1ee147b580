"""What Postgres did in a run, by statement and by table (``bench.postgres_costs``): each statement named as its store
names it, whatever ``pg_stat_statements`` made of its literals, and the counts divided per execution."""

from __future__ import annotations

import re

from sundial_common.stores.queries import load_file

from bench import postgres_costs


def as_pg_stat_statements_shows(sql: str) -> str:
    """A statement as pg_stat_statements keeps it: its literals replaced by parameters numbered after the driver's."""
    count = iter(range(100, 1000))
    return re.sub(r"'[^']*'", lambda _: f"${next(count)}", sql)


def test_each_hot_statement_is_named_by_its_store_name_even_with_its_literals_normalised() -> None:
    executions = load_file("executions.sql")
    dispatch = load_file("dispatch.sql")

    for name, sql in [
        ("start_executions", executions["start_executions"]),
        ("start_executions_as", executions["start_executions_as"]),
        ("finish_executions", executions["finish_executions"]),
        ("insert_executions", dispatch["insert_executions"]),
        ("lock_due_jobs", dispatch["lock_due_jobs"]),
        ("mark_published", dispatch["mark_published"]),
    ]:
        assert postgres_costs.statement_name(as_pg_stat_statements_shows(sql)) == name


def test_a_statement_of_no_store_keeps_its_first_words() -> None:
    assert postgres_costs.statement_name("BEGIN") == "BEGIN"
    assert postgres_costs.statement_name("SELECT count(*)   FROM executions WHERE tenant_id = $1") == (
        "SELECT count(*) FROM executions WHERE te"
    )


def test_table_writes_between_two_reads_and_per_execution() -> None:
    before = {"executions": {"inserted": 10, "updated": 4, "heap_only": 2}}
    after = {
        "executions": {"inserted": 110, "updated": 204, "heap_only": 102},
        "audit_log": {"inserted": 300, "updated": 0, "heap_only": 0},
    }
    tables = postgres_costs.since(before, after)
    assert tables == {
        "executions": {"inserted": 100, "updated": 200, "heap_only": 100},
        "audit_log": {"inserted": 300, "updated": 0, "heap_only": 0},
    }
    start = {
        "calls": 50.0,
        "rows": 100.0,
        "exec_ms": 30.0,
        "plan_ms": 20.0,
        "blks_hit": 1000.0,
        "blks_read": 0.0,
        "blks_dirtied": 10.0,
        "wal_records": 400.0,
        "wal_bytes": 40000.0,
    }
    figures = postgres_costs.per_execution({"start_executions": start}, tables, 100)

    assert figures["by_statement"]["start_executions"] == {
        "calls": 0.5,
        "rows_per_call": 2.0,
        "ms": 0.5,
        "plan_ms": 0.2,
        "blks_hit": 10.0,
        "blks_dirtied": 0.1,
        "wal_records": 4.0,
        "wal_bytes": 400,
    }
    assert figures["wal_records"] == 4.0
    assert figures["table_writes"]["executions"] == {"inserted": 1.0, "updated": 2.0, "heap_only": 1.0}
