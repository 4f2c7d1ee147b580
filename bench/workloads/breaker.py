"""Retry storms: 1,000 executions of a handler that fails every call for 2 minutes, with the breaker and without.

The retry-storm scenario at full size (the e2e test ``tests/e2e/test_retry_breaker.py`` is the same story scaled
down). On a fresh stack per mode, ``--executions`` one-shot jobs of the demo ``outage`` handler (fails every
call until ``--outage`` seconds after registration, then succeeds) are created through the API's batch
endpoint with ``maxAttempts`` 5 and a short exponential backoff (``--initial-delay-ms``, default 2 s, up to
30 s, with jitter: four retries span ~30 s, well inside the outage). ``on`` runs with the breaker at its
defaults (≥ 50 % of ≥ 20 attempts in 60 s; 30 s cool-down doubling to 120 s; 10 probes judged by their failure
ratio; release over 30 s; a retry held at most an hour);
``off`` with ``SUNDIAL_BREAKER_ENABLED=false``. Each mode prints and appends to ``bench/results/<workload>.jsonl``:

* **retries_while_open** — retries dispatched while the breaker was OPEN (audit ``retry`` rows stamped more
  than ``EDGE`` inside an OPEN period; ``..._raw`` without that margin), beside **retries_while_half_open**
  and the probes half-open allowed (``half_opens`` × probes);
* **attempts** — every attempt made (the storm's size); **states** — final states (``DEAD`` is what the
  outage killed); **recovered_s** — from the outage's end until the last execution succeeded;
* the breaker's transitions and their times (seconds after registration);
* **outcome_write** (``on`` only, before the scenario) — the median ``finish_attempts`` of 256 outcomes with the
  window-counting trigger and without it, alternating on the same database: what the breaker costs the
  worker's outcome write.

    uv run --frozen python -m bench breaker --port-offset 300                 # 1,000 executions, 120 s, on,off
    uv run --frozen python -m bench breaker --port-offset 300 --modes on --executions 200 --outage 30

A measurement, never a pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from sundial_common.domain.ids import new_id
from sundial_common.stores import Stores
from sundial_common.stores.breakers import BreakerSettings
from sundial_common.stores.executions import Outcome

from bench import results
from bench.harness import Bench, Shape, ports_at
from bench.results import REPO, RESULTS

#: Audit times are each transaction's start: a retry stamped this close to a transition may have read either state.
EDGE = timedelta(milliseconds=250)
#: The probes a half-open breaker allows at the defaults the sweeper runs with.
PROBES = BreakerSettings().probes


async def run(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    registered = time.time()
    until = registered + args.outage
    retry = {
        "maxAttempts": 5,
        "backoff": "EXPONENTIAL",
        "initialDelayMs": args.initial_delay_ms,
        "maxDelayMs": 30_000,
        "jitter": True,
    }
    jobs = [
        {
            "name": f"outage-{i}",
            "type": "DELAYED",
            "delaySeconds": 0,
            "target": {"pool": "demo", "handler": "outage"},
            "payload": {"until": until},
            "retryPolicy": retry,
        }
        for i in range(args.executions)
    ]
    base = f"http://127.0.0.1:{bench.ports.api}"
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {bench.token}"}, timeout=60) as api:
        for start in range(0, len(jobs), 1000):
            response = await api.post("/v1/jobs:batch", json={"jobs": jobs[start : start + 1000]})
            response.raise_for_status()
    conn = await asyncpg.connect(bench.stack.postgres_dsn)
    try:
        deadline = time.monotonic() + args.outage + 900
        while time.monotonic() < deadline:
            await asyncio.sleep(2.0)  # polling progress: there is no event to wait on
            final = await conn.fetchval(
                "SELECT count(*) FROM executions WHERE handler = 'outage'"
                " AND (state = 'SUCCEEDED' OR (state = 'DEAD' AND next_attempt_at IS NULL))"
            )
            if final >= args.executions:
                break
        states = {
            r["state"]: r["n"]
            for r in await conn.fetch(
                "SELECT state, count(*) AS n FROM executions WHERE handler = 'outage' GROUP BY state"
            )
        }
        attempts = await conn.fetchval(
            "SELECT count(*) FROM execution_attempts a JOIN executions e ON e.id = a.execution_id"
            " WHERE e.handler = 'outage'"
        )
        last_success = await conn.fetchval(
            "SELECT max(finished_at) FROM executions WHERE handler = 'outage' AND state = 'SUCCEEDED'"
        )
        moves = await conn.fetch(
            "SELECT a.at, a.action, a.to_state FROM audit_log a JOIN breakers b ON b.id = a.entity_id"
            " WHERE a.entity = 'breaker' AND b.handler = 'outage' ORDER BY a.id"
        )
        retries = [
            r["at"]
            for r in await conn.fetch(
                "SELECT a.at FROM audit_log a JOIN executions e ON e.id = a.entity_id"
                " WHERE a.entity = 'execution' AND a.action = 'retry' AND e.handler = 'outage'"
            )
        ]
    finally:
        await conn.close()
    spans = [(m["at"], moves[i + 1]["at"] if i + 1 < len(moves) else None, m["to_state"]) for i, m in enumerate(moves)]

    def within(state: str, edge: timedelta) -> int:
        return sum(
            1
            for at in retries
            for start, end, s in spans
            if s == state and start + edge < at and (end is None or at < end - edge)
        )

    origin = datetime.fromtimestamp(registered, UTC)
    return {
        "executions": args.executions,
        "outage_s": args.outage,
        "retry_policy": retry,
        "states": states,
        "dead": states.get("DEAD", 0),
        "attempts": attempts,
        "retries": len(retries),
        "retries_while_open": within("OPEN", EDGE),
        "retries_while_open_raw": within("OPEN", timedelta(0)),
        "retries_while_half_open": within("HALF_OPEN", EDGE),
        "retries_while_half_open_raw": within("HALF_OPEN", timedelta(0)),
        "half_opens": sum(1 for m in moves if m["to_state"] == "HALF_OPEN"),
        "probes_allowed": sum(1 for m in moves if m["to_state"] == "HALF_OPEN") * PROBES,
        "transitions": [(m["action"], round((m["at"] - origin).total_seconds(), 1)) for m in moves],
        "recovered_s": round(last_success.timestamp() - until, 1) if last_success is not None else None,
    }


async def finish_cost(bench: Bench, batches: int = 80, size: int = 256, phase: int = 10) -> dict[str, Any]:
    """What the window-counting trigger adds to the worker's outcome write: ``finish_attempts`` of ``size``
    RUNNING executions per batch (the flusher's default batch), alternately with the trigger on and off, on the
    same database. Median milliseconds per batch each way (the first batch of each phase left out)."""
    stores = await Stores.connect(bench.stack.postgres_dsn, min_size=1, max_size=2)
    timings: dict[bool, list[float]] = {True: [], False: []}
    try:
        pool = stores.database.pool
        job = await pool.fetchval(
            "INSERT INTO jobs (id, tenant_id, name, type, pool, handler, timeout_sec, shard, state)"
            " VALUES ($1, 'bench-api', 'cost', 'ONE_SHOT', 'demo', 'cost', 60, 0, 'COMPLETED') RETURNING id",
            uuid.uuid4(),
        )
        for i in range(batches):
            # Phases of ``phase`` batches each way (on, off, on, off, …): a trigger toggled per batch would make
            # every batch pay the re-planning its ALTER TABLE causes.
            on = (i // phase) % 2 == 0
            if i % phase == 0:
                await pool.execute(
                    f"ALTER TABLE executions {'ENABLE' if on else 'DISABLE'} TRIGGER executions_breaker_counts"
                )
            ids = [new_id() for _ in range(size)]  # of today: executions are partitioned by day of id
            await pool.execute(
                "INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler,"
                " state, timeout_sec, worker_id, started_at)"
                " SELECT id, 'bench-api', $2, now() + make_interval(secs => n), 0, 1, 'demo', 'cost', 'RUNNING', 60,"
                " 'cost', now() FROM unnest($1::uuid[]) WITH ORDINALITY AS u (id, n)",
                ids,
                job,
            )
            await pool.execute(
                "INSERT INTO execution_attempts (execution_id, attempt, tenant_id, worker_id, state)"
                " SELECT id, 1, 'bench-api', 'cost', 'RUNNING' FROM unnest($1::uuid[]) AS u (id)",
                ids,
            )
            outcomes = [Outcome(e, 1, "SUCCEEDED" if k % 2 else "FAILED", error="x") for k, e in enumerate(ids)]
            started = time.perf_counter()
            await stores.executions.finish_attempts("cost", outcomes)
            if i % phase:
                timings[on].append((time.perf_counter() - started) * 1000)
        await pool.execute("ALTER TABLE executions ENABLE TRIGGER executions_breaker_counts")
    finally:
        await stores.close()
    return {
        "batch": size,
        "finish_ms_with_counts": round(statistics.median(timings[True]), 2),
        "finish_ms_without": round(statistics.median(timings[False]), 2),
    }


async def main_async(args: argparse.Namespace) -> None:
    shape = Shape(args.shards, 1, args.workers, args.concurrency, durable=False)
    ports = ports_at(args.port_offset)
    for mode in args.modes.split(","):
        enabled = {"on": "true", "off": "false"}[mode.strip()]
        os.environ["SUNDIAL_BREAKER_ENABLED"] = enabled  # the supervised processes inherit it
        bench = Bench(shape, args.root, ports)
        bench.start()
        try:
            cost = await finish_cost(bench) if mode.strip() == "on" else {}
            result = {
                **(await run(bench, args) if args.executions else {}),
                **({"outcome_write": cost} if cost else {}),
            }
        finally:
            bench.stop()
        settings = {**vars(shape), "breaker": enabled == "true", "executions": args.executions}
        results.record("breaker", result, settings, results=args.results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench breaker", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--executions", type=int, default=1000, help="0: only the outcome-write cost (mode on)")
    parser.add_argument("--outage", type=float, default=120.0, help="seconds the handler fails every call")
    parser.add_argument("--initial-delay-ms", type=int, default=2000, help="the retry policy's first backoff")
    parser.add_argument("--modes", default="on,off", help="breaker on, off or both (on,off), in this order")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=64, help="handler slots per worker")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--root", type=Path, default=REPO / ".sundial" / "bench-breaker")
    parser.add_argument("--port-offset", type=int, default=0, help="ports = BENCH_PORTS + this (a multiple of 100)")
    asyncio.run(main_async(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
