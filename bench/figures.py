"""The figures of a dispatch run, computed from its rows: lateness percentiles, by phase and by stage, where the
first start went, how much was done before its due instant; where Postgres's CPU and time went (by client, by
statement). Pure functions of what :class:`bench.harness.Bench` read, so each is the same for every workload."""

from __future__ import annotations

import contextlib
import os
import re
import statistics
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

from bench import machine


def postgres_ticks_by_client(postgres_pid: int, clients: dict[str, int]) -> dict[int, tuple[str, int]]:
    """Each Postgres process's utime + stime ticks so far and who it works for: a backend under the name of the
    process tree in ``clients`` that holds its connection's other end (the client port in its process title), the
    server's own processes by their title (``autovacuum launcher``, ``checkpointer``, ``walwriter``...); the
    postmaster is ``exited`` (its ticks include the processes it reaped: autovacuum workers, closed connections).
    Read from /proc only, twice a run: the same source as :meth:`Bench.cpu`."""
    parents, usage = machine.proc_table()
    ticks = {pid: u.ticks for pid, u in usage.items()}
    # The local port of every TCP socket (inode -> port), then which client process holds each socket: a process
    # counts for its nearest ancestor named in ``clients`` (machine.owner); the harness for itself only (its tree
    # holds every supervised process and the servers).
    port_of_inode: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                port_of_inode[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    roots = {pid: name for name, pid in clients.items()}
    client_of_port: dict[int, str] = {}
    for pid in parents:
        name = machine.owner(pid, parents, roots)
        if name is None or (name == "harness" and pid != clients["harness"]):
            continue
        with contextlib.suppress(OSError):
            for fd in os.scandir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(fd.path)
                    if link.startswith("socket:[") and (port := port_of_inode.get(link[8:-1])) is not None:
                        client_of_port.setdefault(port, name)
    owners: dict[int, tuple[str, int]] = {postgres_pid: ("exited", ticks.get(postgres_pid, 0))}
    for pid in (pid for pid, parent in parents.items() if parent == postgres_pid):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        client = re.search(r"\((\d+)\)", title)
        if client:
            name = client_of_port.get(int(client.group(1)), "other client")
        else:
            name = title.removeprefix("postgres: ").strip()
        owners[pid] = (name, ticks.get(pid, 0))
    return owners


def postgres_by_client(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]]) -> dict[str, float]:
    """Postgres's CPU seconds between two ``postgres_ticks_by_client`` reads, by who asked (a process alive at
    both reads counts its difference, one that started between them all of its ticks)."""
    seconds: dict[str, float] = {}
    for pid, (name, now) in after.items():
        seconds[name] = seconds.get(name, 0.0) + (now - before.get(pid, (name, 0))[1]) / os.sysconf("SC_CLK_TCK")
    return {name: round(s, 2) for name, s in sorted(seconds.items(), key=lambda item: -item[1])}


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)

    return {"p50": round(statistics.median(ordered), 1), "p95": at(0.95), "p99": at(0.99), "max": round(ordered[-1], 1)}


async def top_statements(conn: asyncpg.Connection, limit: int = 8) -> list[dict[str, Any]]:
    """Where the database time went: the statements with the most execution and planning time since the last
    reset (``total_ms`` executing, ``plan_ms`` planning, ``plans`` how many times planned)."""
    rows = await conn.fetch(
        """SELECT calls, plans, rows, total_exec_time, total_plan_time,
                  left(regexp_replace(query, '\\s+', ' ', 'g'), 90) AS query
           FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%'
           ORDER BY total_exec_time + total_plan_time DESC LIMIT $1""",
        limit,
    )
    return [
        {
            "query": r["query"],
            "calls": r["calls"],
            # Times planned: a statement run under a generic plan (the census) is planned once per connection.
            "plans": r["plans"],
            "rows": r["rows"],
            "total_ms": round(r["total_exec_time"]),
            "plan_ms": round(r["total_plan_time"]),
        }
        for r in rows
    ]


def first_start(rows: Sequence[Any]) -> dict[str, float | None] | None:
    if not rows:
        return None
    first = min(rows, key=lambda r: r["started_at"])

    def after_due(at: datetime | None) -> float | None:
        return round((at - first["scheduled_for"]).total_seconds() * 1000, 1) if at is not None else None

    return {
        k: after_due(first[c])
        for k, c in (("committed", "created_at"), ("produced", "published_at"), ("started", "started_at"))
    }


def stages(rows: Sequence[Any]) -> dict[str, dict[str, float | None]]:
    """Per stage, its duration's percentiles: due → dispatch transaction began (``created_at``) → message produced
    (``published_at``: the broker timestamp, the producer's create time) → start CAS began (``started_at``).
    The last stage holds the linger, the broker's ack, the consumer's fetch and the worker's batching."""
    stages: dict[str, list[float]] = {"dispatch": [], "produce": [], "consume_start": []}
    for r in rows:
        if r["published_at"] is None:
            continue
        stages["dispatch"].append((r["created_at"] - r["scheduled_for"]).total_seconds() * 1000)
        stages["produce"].append((r["published_at"] - r["created_at"]).total_seconds() * 1000)
        stages["consume_start"].append((r["started_at"] - r["published_at"]).total_seconds() * 1000)
    return {name: percentiles(values) for name, values in stages.items()}


def late_causes(rows: Sequence[Any], over_ms: float = 1000.0) -> dict[str, int]:
    """Every execution that started more than ``over_ms`` after its due instant, counted by what made it late: its job
    created after that instant (``created_after_due``: the registration, not the scheduler — such a job waits for the
    hydrator's overdue scan), else the stage of :func:`stages` it spent longest in (``dispatch``, ``produce``,
    ``consume_start``; ``unpublished``: no produce time recorded). Empty: none was that late."""
    causes: dict[str, int] = {}
    for r in rows:
        if (r["started_at"] - r["scheduled_for"]).total_seconds() * 1000 <= over_ms:
            continue
        if r["job_created_at"] is not None and r["job_created_at"] > r["scheduled_for"]:
            cause = "created_after_due"
        elif r["published_at"] is None:
            cause = "unpublished"
        else:
            spent = {
                "dispatch": r["created_at"] - r["scheduled_for"],
                "produce": r["published_at"] - r["created_at"],
                "consume_start": r["started_at"] - r["published_at"],
            }
            cause = max(spent, key=lambda stage: spent[stage])
        causes[cause] = causes.get(cause, 0) + 1
    return causes


def before_due(rows: Sequence[Any]) -> dict[str, int]:
    """Executions whose dispatch transaction began (``created_at``) / whose message was produced (``published_at``)
    before their due instant (``scheduled_for``)."""
    return {
        "committed": sum(1 for r in rows if r["created_at"] < r["scheduled_for"]),
        "produced": sum(1 for r in rows if r["published_at"] is not None and r["published_at"] < r["scheduled_for"]),
    }


def by_phase(rows: Sequence[Any], first_due: datetime, head_sec: float) -> dict[str, dict[str, float | None]]:
    """Lateness percentiles of the jobs due within ``head_sec`` of the first due instant, and of the others."""
    phases: dict[str, list[float]] = {f"first_{head_sec:g}s": [], "rest": []}
    head, rest = phases.values()
    for r in rows:
        late = (r["started_at"] - r["scheduled_for"]).total_seconds() * 1000
        (head if (r["scheduled_for"] - first_due).total_seconds() < head_sec else rest).append(late)
    return {name: percentiles(values) for name, values in phases.items()}
