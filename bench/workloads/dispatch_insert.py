"""The dispatch transaction's statements: the head's ``lock_due_jobs`` and ``insert_executions`` against an earlier
commit's, on one Postgres.

What a W3 pair cannot resolve on a shared 2-core machine (its neighbours move a process's CPU per execution by
±20 % between two runs of the same code): one Postgres, one database at the head's schema, two connections (one
per form of the statement), rounds alternated. Each round inserts ``--batch`` due one-shot jobs and dispatches
them in the fenced transaction (the form's ``lock_due_jobs``, then its ``insert_executions``), as
``PostgresDispatchStore.dispatch_shards`` does. Per form: the client's CPU microseconds per execution in the
insert's ``fetch`` (asyncpg encodes every array element there; the arguments' lists are built before it) and in
the lock's (asyncpg decodes every column of every locked job there), the CPU of the form's backend per execution
(/proc: the job rows are the same in both), and from pg_stat_statements the insert's and the lock's mean
execution and planning milliseconds.

The other form is ``--base``'s ``dispatch.sql`` (a commit's, by git show, or a file not committed yet): with 26
parameters, the arguments as 5427f15 sent them (17 arrays per execution, each inherited column of the job sent
back); with 19, the arguments with every array full (8 per execution: the rest is read from the job's move in
SQL), unless the form reads an empty one as its column's default (as the head's ``insert_executions`` does).

    uv run --frozen python -m bench dispatch-insert --port-offset 100 [--base 5427f15|FILE] [--batch 100] [--rounds 300]

A measurement, never a pass/fail. Appends one JSON line to ``bench/results/<workload>.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import orjson
from sundial_common.domain.ids import new_execution_id
from sundial_common.stores.dispatch import PlannedExecution, insert_arguments
from sundial_common.stores.queries import load, load_file
from sundial_infra.servers.postgres import PostgresServer
from sundial_infra.stack import BENCH_PORTS

from bench import machine, results
from bench.harness import POSTGRES_SETTINGS, fresh_database
from bench.results import REPO, RESULTS
from bench.workloads.storage import TENANT, due_jobs

HEAD = load_file("dispatch.sql")
SQL = "libs/common/sundial_common/stores/sql/dispatch.sql"


def base_arguments(rows: list[Any], ids: list[Any], traceparents: list[str]) -> list[object]:
    """``insert_executions``'s 26 parameters as the earlier form took them (one shard, token 1)."""
    n = len(rows)
    return [
        ids,
        [r["tenant_id"] for r in rows],
        [r["id"] for r in rows],
        [r["next_fire_at"] for r in rows],
        [r["pool"] for r in rows],
        [r["handler"] for r in rows],
        [int((r["retry_policy"] or {}).get("maxAttempts", 1)) for r in rows],
        [r["timeout_sec"] for r in rows],
        [0] * n,
        [1] * n,
        [t.split("-")[1] for t in traceparents],
        traceparents,
        "bench",
        [r["next_fire_at"] for r in rows],
        ["PENDING"] * n,
        [False] * n,
        [None] * n,
        [r["priority"] for r in rows],
        *advances(rows),
    ]


def full_arguments(rows: list[Any], ids: list[Any], traceparents: list[str]) -> list[object]:
    """The 19 parameters with every array full: a form that does not read an empty array as its column's default
    (as the statement was before it did)."""
    n = len(rows)
    nominal = [r["next_nominal_at"] or r["next_fire_at"] for r in rows]
    return [ids, [r["id"] for r in rows], nominal, [r["next_fire_at"] for r in rows], ["PENDING"] * n, [False] * n,
            [None] * n, traceparents, [0], [1], *advances(rows), "bench"]  # fmt: skip


def advances(rows: list[Any]) -> list[list[object]]:
    n = len(rows)
    return [[r["id"] for r in rows], [r["next_fire_at"] for r in rows], [None] * n, [None] * n, [1] * n, [0] * n,
            [True] * n, [False] * n]  # fmt: skip


def head_arguments(rows: list[Any], ids: list[Any], traceparents: list[str]) -> list[object]:
    from sundial_common.stores.dispatch import JobAdvance

    planned = [PlannedExecution(i, r, None, t) for i, r, t in zip(ids, rows, traceparents, strict=True)]
    moves = [JobAdvance(r["id"], r["next_fire_at"], None, None, runs=1) for r in rows]
    return insert_arguments(planned, moves, {0: 1}, "bench")


async def binary_jsonb(conn: asyncpg.Connection) -> None:
    """jsonb in binary, a version byte then the JSON text, as the services' connections read and write it."""
    await conn.set_type_codec(
        "jsonb",
        schema="pg_catalog",
        encoder=lambda value: b"\x01" + orjson.dumps(value),
        decoder=lambda data: orjson.loads(data[1:]),
        format="binary",
    )


async def one_round(conn: asyncpg.Connection, form: str, lock: str, insert: str, batch: int) -> tuple[float, float]:
    """``batch`` due jobs locked through ``lock`` and dispatched through ``insert``: the client CPU seconds of the
    insert's fetch and of the lock's."""
    due, jobs = await due_jobs(conn, batch)
    ids = [new_execution_id() for _ in jobs]
    traceparents = [f"00-{i.hex}-{i.hex[:16]}-01" for i in ids]
    async with conn.transaction():
        started = time.process_time()
        rows = await conn.fetch(lock, jobs, [due] * batch, [0], [1], "bench", [0] * batch)
        locking = time.process_time() - started
        rows = [r for r in rows if r["id"] is not None]
        build = (
            base_arguments if "$26" in insert else head_arguments if "coalesce(runs, 1)" in insert else full_arguments
        )
        arguments = build(rows, ids, traceparents)
        started = time.process_time()
        inserted = await conn.fetch(insert, *arguments)
        took = time.process_time() - started
    assert len(inserted) == batch, (form, len(inserted))
    return took, locking


async def main_async(args: argparse.Namespace, base_sql: str) -> None:
    base = load(base_sql)
    forms = {"base": base["insert_executions"], "head": HEAD["insert_executions"]}
    locks = {"base": base["lock_due_jobs"], "head": HEAD["lock_due_jobs"]}
    root = args.root.resolve()
    shutil.rmtree(root, ignore_errors=True)
    server = PostgresServer(root / "postgres", BENCH_PORTS.postgres + args.port_offset, settings=POSTGRES_SETTINGS)
    server.start()
    try:
        dsn = await fresh_database(server, "dispatch_insert", "head", track_planning=True)
        setup = await asyncpg.connect(dsn)
        await setup.fetchval("SELECT sundial_add_execution_partitions($1::date, $2::int)", datetime.now(UTC).date(), 40)
        await setup.execute("INSERT INTO tenants (id) VALUES ($1)", TENANT)
        conns = {form: await asyncpg.connect(dsn) for form in forms}
        for form, conn in conns.items():
            await binary_jsonb(conn)  # the services' codec
            for _ in range(5):
                await one_round(conn, form, locks[form], forms[form], args.batch)  # plans cached, buffers warm
        await setup.execute("SELECT pg_stat_statements_reset()")
        pids = {form: conn.get_server_pid() for form, conn in conns.items()}
        client = dict.fromkeys(forms, 0.0)
        client_lock = dict.fromkeys(forms, 0.0)
        ticks = dict.fromkeys(forms, 0)
        for r in range(args.rounds):
            for form in list(forms) if r % 2 == 0 else reversed(list(forms)):
                before = machine.cpu_ticks(pids[form])
                took, locking = await one_round(conns[form], form, locks[form], forms[form], args.batch)
                client[form] += took
                client_lock[form] += locking
                ticks[form] += machine.cpu_ticks(pids[form]) - before
        executions = args.rounds * args.batch
        line: dict[str, Any] = {}
        for form in forms:
            line[form] = {
                "client_us_per_execution": round(client[form] / executions * 1e6, 2),
                "lock_client_us_per_execution": round(client_lock[form] / executions * 1e6, 2),
                "backend_us_per_execution": round(ticks[form] / os.sysconf("SC_CLK_TCK") / executions * 1e6, 1),
            }
            for name, sql in (("insert", forms[form]), ("lock", locks[form])):
                row = await setup.fetchrow(
                    "SELECT sum(calls) AS calls, sum(total_exec_time) / sum(calls) AS mean_ms,"
                    " sum(total_plan_time) / sum(calls) AS plan_ms FROM pg_stat_statements"
                    " WHERE query = $1",
                    sql.rstrip(";"),  # stored without the closing semicolon
                )
                # One statement of both forms (the same text) is counted once, for both.
                line[form][f"{name}_mean_ms"] = round(float(row["mean_ms"]), 3) if row["calls"] else None
                line[form][f"{name}_plan_ms"] = round(float(row["plan_ms"]), 3) if row["calls"] else None
        for conn in (*conns.values(), setup):
            await conn.close()
        settings = {"base_commit": args.base_name, "batch": args.batch, "rounds": args.rounds}
        results.record("dispatch-insert", line, settings, results=args.results)
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench dispatch-insert", description=__doc__)
    parser.add_argument("--base", default="5427f15", help="the commit (or a dispatch.sql) whose insert is compared")
    parser.add_argument("--batch", type=int, default=100, help="executions per dispatch transaction")
    parser.add_argument("--rounds", type=int, default=60, help="rounds per form, alternated")
    parser.add_argument("--port-offset", type=int, default=100)
    parser.add_argument("--root", type=Path, default=REPO / ".sundial" / "bench-dispatch-insert")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    # A file outside the repository is named in the results by what it is, not by its path.
    args.base_name = "an uncommitted dispatch.sql" if Path(args.base).is_file() else args.base
    if Path(args.base).is_file():  # a dispatch.sql not committed yet
        base = Path(args.base).read_text()
    else:
        base = subprocess.run(
            ["git", "show", f"{args.base}:{SQL}"], cwd=REPO, check=True, capture_output=True, text=True
        ).stdout
    asyncio.run(main_async(args, base))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
