"""`make bench`'s run: the workloads that share one stack shape, W1-W4, idle, the raw ceilings and API creates.

Workloads (the targets: P95 dispatch latency < 1 s; 1M dispatches/min on a fleet):

- ``create``  API create rate under wrk: single POSTs (with and without Idempotency-Key) and batches
              (workloads/create.py).
- ``w1``      burst: N one-shot jobs all due at the same instant (``--burst 10000,100000``).
- ``w2``      spread: 20,000 jobs due uniformly over 60 s.
- ``w3``      sustained: a target rate of due executions per second for ``--duration`` s
              (``--rates 1000,2500,5000,10000``); after its rates, one line: the highest sustained (P95 lateness
              <= 500 ms), lateness at 1,000/s, CPU per execution of workers, gateways and Postgres (bench/ladder.py).
- ``curve``   the same spread at several rates (``--curve-rates 50,333,1000,2500``, each over ``--duration``),
              created through the API: CPU, statements, transactions and produce requests per execution
              (workloads/curve.py).
- ``w4``      at rest: N future recurring jobs (workloads/at_rest.py); hydrator passes; table and index sizes.
- ``idle``    the ``make up`` stack doing nothing: CPU per process over 60 s, memory (workloads/idle.py).
- ``idle-floor`` the same servers alone (set up, no Sundial process): the floor under ``idle`` (not in the default).
- ``ceilings`` the raw parts: Postgres batched inserts, Redis ZADD and claim, broker produce/consume.

``python -m bench`` runs them all but ``idle-floor``; ``python -m bench w1 w3 --scale 0.1`` the ones named. W2 and
W3 insert their jobs straight into Postgres (COPY, as a bulk registration would; W1 through the API unless
``--create copy``), so what they measure is the scheduling path: hydrator → hot window → dispatcher → Kafka →
worker (:mod:`bench.harness`). Each run prints one JSON line and appends it to
``bench/results/<workload>.jsonl`` (:mod:`bench.results`). A benchmark measures and records; it never passes
or fails on timing.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import ladder, results
from bench.harness import PROFILES, STACK_ROOT, Bench, Shape, burst, ports_at, spread
from bench.workloads import at_rest, ceilings, create, curve, idle

#: The workloads this run knows, in the order it runs them; all but ``idle-floor`` by default.
WORKLOADS = ("idle", "idle-floor", "ceilings", "w4", "create", "w1", "w2", "w3", "curve")
DEFAULT = ("idle", "ceilings", "create", "w1", "w2", "w3", "curve", "w4")
#: W4 (workloads/at_rest.py) runs on the bench ports + the run's offset + this: it never meets a stack the run left.
AT_REST_PORT_OFFSET = 10


async def main_async(args: argparse.Namespace) -> None:
    shape = Shape(
        args.shards,
        args.dispatchers,
        args.workers,
        args.concurrency,
        not args.no_durable,
        not args.no_analytics,
        args.past_days,
        args.worker_transport,
    )
    bench = Bench(shape, args.root, ports_at(args.port_offset), args.profile)
    settings = vars(shape)

    def record(workload: str, figures: dict[str, Any], run_settings: dict[str, Any] | None = None) -> None:
        results.record(workload, figures, {**settings, **(run_settings or {})}, results=args.results)

    for name, servers_only in (("idle", False), ("idle-floor", True)):
        if name in args.workloads:
            # The `make up` stack doing nothing: CPU per process over 60 s, memory (workloads/idle.py); its shape
            # is make up's, not --shards…
            root = args.root.with_name(args.root.name + "-idle")
            line = idle.measure(root, args.port_offset, settle=30.0, seconds=60.0, servers_only=servers_only)
            results.record(name, line, {"settle_s": line.pop("settle_s")}, results=args.results, cpu_probe=False)
    if "ceilings" in args.workloads:
        # The parts alone, before Sundial's processes compete for the cores.
        bench.stack.start()
        try:
            stack = bench.stack
            line = await ceilings.measure_all(stack.postgres_dsn, stack.redis_url, stack.kafka_bootstrap, args.scale)
            record("ceilings", line, {"scale": args.scale})
        finally:
            bench.stack.stop()
    if "w4" in args.workloads:
        # At rest: N future recurring jobs, one hydrator rebuild and steady passes, table and index sizes.
        at_rest_args = argparse.Namespace(
            jobs=int(args.at_rest * args.scale),
            shards=args.shards,
            steady_passes=30,
            port_offset=args.port_offset + AT_REST_PORT_OFFSET,
            keep=False,
            reuse=False,
        )
        line = await at_rest.main_async(at_rest_args)
        record("w4", line, {key: line.pop(key) for key in at_rest.SETTINGS})
    if "create" in args.workloads:
        # One API process under wrk, single and batch creates, on a stack of their own (workloads/create.py).
        loads = args.create_loads or list(create.LOADS)
        for line in await create.measure(bench, max(2.0, 20 * args.scale), loads, args.create_delay):
            record("create", line, {key: line.pop(key) for key in create.SETTINGS})
    # Each run on a fresh stack: the broker keeps every message in memory and Postgres keeps every
    # execution, so a run measured after another would pay for what the earlier one left behind.
    # The due instants are made when each run starts (its stack up): they are relative to that moment.
    runs: list[tuple[str, dict[str, Any], Callable[[], list[datetime]], str]] = []
    for n in (int(b * args.scale) for b in args.burst) if "w1" in args.workloads else []:
        per_s = 5_000 if args.create == "api" else 50_000  # time to register them before they are due
        runs.append(("w1", {"burst": n}, functools.partial(burst, n, args.lead, per_s), args.create))
    if "w2" in args.workloads:
        n = int(20_000 * args.scale)
        runs.append(("w2", {"over_s": args.duration}, functools.partial(spread, n, args.duration, args.lead), "copy"))
    for rate in args.rates if "w3" in args.workloads else []:
        due = functools.partial(spread, int(rate * args.duration), args.duration, args.lead)
        runs.append(("w3", {"target_per_s": rate, "duration_s": args.duration}, due, "copy"))
    ladder_runs: list[tuple[int, dict[str, Any]]] = []
    for workload, run_settings, make_due, created in runs:
        bench.start()
        try:
            load_before = ladder.load_1m()
            figures = await bench.run_dispatch(workload, make_due(), create=created)
            figures["load_1m"] = {"start": load_before, "end": ladder.load_1m()}
            record(workload, figures, run_settings)
            if workload == "w3":
                ladder_runs.append((run_settings["target_per_s"], figures))
        finally:
            bench.stop()
    if ladder_runs:
        # The ladder's verdict: the highest rate sustained (P95 <= 500 ms), lateness at 1,000/s, CPU per execution.
        # A summary of the W3 lines above, not a record of its own: prefixed, so that every line starting with "{"
        # stays one run's record.
        print("ladder:", json.dumps(ladder.summary(args.worker_transport, ladder_runs)), flush=True)
    if "curve" in args.workloads:
        curve_args = argparse.Namespace(
            **{key: getattr(args, key) for key in ("shards", "dispatchers", "workers", "concurrency", "no_durable")},
            **{key: getattr(args, key) for key in ("no_analytics", "port_offset", "root", "results", "duration")},
            rates=[max(1, round(rate * args.scale)) for rate in args.curve_rates],
            idle=args.curve_idle,
            lead=args.lead,
            create="api",
        )
        await curve.main_async(curve_args)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "workloads",
        nargs="*",
        default=list(DEFAULT),
        metavar="WORKLOAD",
        help=f"of {', '.join(WORKLOADS)} (default: all but idle-floor)",
    )
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--dispatchers", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=256, help="handler slots per worker")
    parser.add_argument(
        "--worker-transport",
        choices=("direct", "gateway", "http"),
        default="direct",
        help="`gateway`: each worker runs through a worker gateway of its own with a pool token; `http`: the pool is "
        "an HTTP pool and the workers are delivery workers POSTing to a local receiver (default direct)",
    )
    parser.add_argument("--burst", type=_ints, default=[10_000, 100_000], help="W1 sizes")
    parser.add_argument("--rates", type=_ints, default=[1000, 2500, 5000, 10000], help="W3 rates per second")
    parser.add_argument("--curve-rates", type=_ints, default=[50, 333, 1000, 2500], help="the cost curve's rates")
    parser.add_argument("--curve-idle", type=float, default=10.0, help="the curve: seconds of idle CPU measured")
    parser.add_argument("--duration", type=float, default=60.0, help="W2/W3 and each rate of the curve: seconds")
    parser.add_argument("--at-rest", type=int, default=1_000_000, help="W4 jobs")
    parser.add_argument("--lead", type=float, default=5.0, help="seconds between registration and first due")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every count (0.01 = smoke)")
    parser.add_argument("--results", type=Path, default=results.RESULTS, help="directory of the <workload>.jsonl files")
    parser.add_argument("--root", type=Path, default=STACK_ROOT, help="the stack's data directory")
    parser.add_argument(
        "--port-offset",
        type=int,
        default=0,
        help="ports = the bench ports (sundial_infra.stack.BENCH_PORTS) + this; a multiple of 100, at most 1500",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        nargs="?",
        const=PROFILES,
        help=f"py-spy a dispatcher, a worker and analytics into this directory (default {PROFILES})",
    )
    parser.add_argument(
        "--create-loads",
        type=lambda text: text.split(","),
        help=f"create: which of {','.join(create.LOADS)} (default: all)",
    )
    parser.add_argument(
        "--create-delay", type=int, default=86400, help="create: the jobs' delaySeconds (< 3600: in the hot window)"
    )
    parser.add_argument(
        "--create", choices=["api", "copy"], default="api", help="W1: jobs created through POST /v1/jobs:batch or COPY"
    )
    parser.add_argument("--no-durable", action="store_true", help="Postgres without fsync (as in tests)")
    parser.add_argument(
        "--past-days",
        type=int,
        default=30,
        help="empty daily partitions of executions made for this many past days, as a stack that has run that long"
        " with the default 30-day retention carries (38 partitions); 0: a fresh stack's 8",
    )
    parser.add_argument(
        "--no-analytics",
        action="store_true",
        help="without the ClickHouse replica: outbox triggers disabled, no analytics service (its cost by difference)",
    )
    args = parser.parse_args(argv)
    if unknown := set(args.workloads) - set(WORKLOADS):
        parser.error(f"unknown workloads {sorted(unknown)}: choose from {', '.join(WORKLOADS)}")
    if unknown := set(args.create_loads or ()) - set(create.LOADS):
        parser.error(f"unknown create loads {sorted(unknown)}: choose from {', '.join(create.LOADS)}")
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
