"""What Postgres did for a run, statement by statement and table by table, in figures that do not depend on load.

:func:`statement_costs` reads ``pg_stat_statements`` (reset when a run's window opens): per statement, named by its
``-- name:`` in the stores' SQL files, its calls and rows, its execution and planning milliseconds, the shared buffers
it hit and dirtied, and the WAL records and bytes it wrote. :func:`table_writes` reads ``pg_stat_user_tables`` for the
tables an execution writes (their partitions summed): rows inserted, updated, and of those updates how many were
heap-only (no index entry written). Counts per execution are the same on a quiet machine and a busy one; the times
are not. :func:`per_execution` divides both by the run's executions.
"""

from __future__ import annotations

import functools
import re
from importlib.resources import files
from typing import Any

import asyncpg
from sundial_common.stores.queries import load

#: The tables an execution writes, each read as the sum of its partitions (and itself, for a plain table).
TABLES = ("executions", "execution_attempts", "audit_log", "jobs")
#: Characters of a statement's opening that name it (its leading comment, as ``pg_stat_statements`` keeps it).
_PREFIX = 60

_STATEMENTS = """
SELECT queryid, calls, plans, rows, total_exec_time, total_plan_time, shared_blks_hit, shared_blks_read,
       shared_blks_dirtied, wal_records, wal_bytes, query
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query NOT LIKE '%pg_stat_statements%'"""

_TABLES = """
SELECT coalesce(parent.relname, t.relname) AS "table", sum(t.n_tup_ins)::bigint AS inserted,
       sum(t.n_tup_upd)::bigint AS updated, sum(t.n_tup_hot_upd)::bigint AS heap_only
FROM pg_stat_user_tables t
LEFT JOIN pg_inherits i ON i.inhrelid = t.relid
LEFT JOIN pg_class parent ON parent.oid = i.inhparent
WHERE coalesce(parent.relname, t.relname) = ANY($1::text[])
GROUP BY 1"""


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@functools.cache
def _names() -> dict[str, str]:
    """The opening of every named statement of the stores' SQL files -> its name. The opening stops before the first
    literal (``pg_stat_statements`` shows literals as ``$n``)."""
    names: dict[str, str] = {}
    for path in files("sundial_common").joinpath("stores", "sql").iterdir():
        if not path.name.endswith(".sql"):
            continue
        for name, body in load(path.read_text()).items():
            opening = _normal(body)[:_PREFIX].split("'")[0]
            names[opening] = name if opening not in names else f"{names[opening]}|{name}"
    return names


def statement_name(query: str) -> str:
    """The ``-- name:`` of the stores' statement that ``query`` (as ``pg_stat_statements`` shows it) is, or its
    first words (a statement of no store: BEGIN, COMMIT, the bench's own)."""
    text = _normal(query)
    found = [(len(opening), name) for opening, name in _names().items() if opening and text.startswith(opening)]
    if not found:
        text = text.removeprefix("COPY (")
        found = [(len(opening), name) for opening, name in _names().items() if opening and text.startswith(opening)]
    return max(found)[1] if found else text[:40]


async def statement_costs(conn: asyncpg.Connection) -> dict[str, dict[str, float]]:
    """Every statement since ``pg_stat_statements`` was last reset, by name (several entries of one name, e.g. one
    per number of parameters, are added up), most calls first."""
    costs: dict[str, dict[str, float]] = {}
    for r in await conn.fetch(_STATEMENTS):
        entry = costs.setdefault(
            statement_name(r["query"]),
            dict.fromkeys(("calls", "rows", "exec_ms", "plan_ms", "blks_hit", "blks_read", "blks_dirtied"), 0.0)
            | {"wal_records": 0.0, "wal_bytes": 0.0},
        )
        entry["calls"] += r["calls"]
        entry["rows"] += r["rows"]
        entry["exec_ms"] += r["total_exec_time"]
        entry["plan_ms"] += r["total_plan_time"]
        entry["blks_hit"] += r["shared_blks_hit"]
        entry["blks_read"] += r["shared_blks_read"]
        entry["blks_dirtied"] += r["shared_blks_dirtied"]
        entry["wal_records"] += r["wal_records"]
        entry["wal_bytes"] += float(r["wal_bytes"])
    ordered = sorted(costs.items(), key=lambda item: -item[1]["calls"])
    return {name: {k: round(v, 1) for k, v in entry.items()} for name, entry in ordered}


async def table_writes(conn: asyncpg.Connection) -> dict[str, dict[str, int]]:
    """Rows inserted and updated so far in each of :data:`TABLES`, and how many updates were heap-only. Counts are
    cumulative (since the stack started): a run subtracts a read taken when its window opened (:func:`since`)."""
    rows = await conn.fetch(_TABLES, list(TABLES))
    return {r["table"]: {k: int(r[k] or 0) for k in ("inserted", "updated", "heap_only")} for r in rows}


def since(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The writes of :func:`table_writes` between two reads."""
    empty: dict[str, int] = {}
    return {
        table: {k: v - before.get(table, empty).get(k, 0) for k, v in counts.items()} for table, counts in after.items()
    }


def per_execution(
    statements: dict[str, dict[str, float]], tables: dict[str, dict[str, int]], executions: int, top: int = 12
) -> dict[str, Any]:
    """The run's statements (the ``top`` most called) and table writes divided by its executions: calls, blocks and
    WAL an execution, rows a call, milliseconds (execution + planning) an execution."""
    n = max(1, executions)
    by_statement = {
        name: {
            "calls": round(s["calls"] / n, 3),
            "rows_per_call": round(s["rows"] / s["calls"], 2) if s["calls"] else None,
            "ms": round((s["exec_ms"] + s["plan_ms"]) / n, 4),
            "plan_ms": round(s["plan_ms"] / n, 4),
            "blks_hit": round(s["blks_hit"] / n, 1),
            "blks_dirtied": round(s["blks_dirtied"] / n, 2),
            "wal_records": round(s["wal_records"] / n, 2),
            "wal_bytes": round(s["wal_bytes"] / n),
        }
        for name, s in list(statements.items())[:top]
    }
    return {
        "by_statement": by_statement,
        "wal_records": round(sum(s["wal_records"] for s in statements.values()) / n, 2),
        "wal_bytes_by_statements": round(sum(s["wal_bytes"] for s in statements.values()) / n),
        "table_writes": {table: {k: round(v / n, 3) for k, v in counts.items()} for table, counts in tables.items()},
    }
