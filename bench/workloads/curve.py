"""The cost curve: the same spread of one-shot jobs at several rates, and what each execution costs at each.

A workload of ``make bench`` (:mod:`bench.suite`). For each rate of ``--curve-rates`` (default 50, 333, 1,000 and
2,500 due a second), on a fresh stack of the suite's shape: ``rate x --duration`` one-shot ``echo`` jobs, created
through ``POST /v1/jobs:batch`` as a user creates them, due evenly over ``--duration`` seconds. Before the jobs,
the stack sits idle for ``--curve-idle`` seconds (10), and its CPU over that window, per process, is what it costs
doing nothing: the run's CPU *net of idle* subtracts it, scaled to the run's window. Each rate's line records, per
execution:

- CPU milliseconds by process and in total (gross, and net of the idle stack), and the whole machine's busy CPU;
- Postgres statements and transactions, and the broker's produce requests (Tansu's own count, exported over
  OTLP to a receiver this workload runs);
- what Postgres did (:mod:`bench.postgres_costs`): per statement its calls, rows a call, milliseconds, blocks hit and
  dirtied and WAL, per table the rows inserted and updated and how many updates were heap-only, and the WAL bytes;
- lateness (handler start - due) P50/P95/max, and the run's whole line as W2 has it (``run``).

Burst and spread then compare directly: a burst costs about 0.55 ms an execution on the machine the results come
from, and a rate whose cost is many times that pays per execution what a burst pays per batch. A measurement,
never a pass/fail::

    uv run --frozen python -m bench curve --port-offset 700          # 50, 333, 1,000 and 2,500/s, 60 s each
    uv run --frozen python -m bench curve --curve-rates 333           # W2 (20,000 over 60 s) with batch creates

Prints one JSON line per rate (appended to ``bench/results/curve.jsonl``).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from bench import postgres_costs, results
from bench.harness import Bench, Shape, ports_at, whole_ms
from bench.workloads.broker_requests import counters_of

#: API batch creates a second the lead allows for: the bench's API creates ~11,000 a second on a quiet machine,
#: 600-2,000 on a loaded one, and a job created after its due instant waits for the hydrator's overdue scan (15-25 s
#: late, named ``created_after_due`` in the line's ``late_over_1s_by_cause``), which is not what the curve measures.
CREATE_PER_S = 1_000
#: How often the broker exports its request counters (ms), and how long the end of a run waits for the last export.
EXPORT_INTERVAL_MS = 1000
SETTINGS = ("rate_per_s", "duration_s", "created")


class BrokerCounters:
    """An OTLP/HTTP metrics receiver on 127.0.0.1 keeping the broker's latest cumulative request counters."""

    def __init__(self, port: int) -> None:
        self.latest: dict[str, float] = {}
        self.exports = 0
        sink = self

        class Receiver(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                counters = counters_of(body)
                if counters:
                    sink.latest = {**sink.latest, **counters}
                    sink.exports += 1
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", port), Receiver)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reset(self) -> None:
        """Forget what an earlier stack's broker exported (a fresh broker counts from 0)."""
        self.latest, self.exports = {}, 0

    def produce_requests(self) -> float | None:
        return self.latest.get("Produce") if self.exports else None

    async def settled(self) -> float | None:
        """The produce requests so far, once an export made after this call has arrived (None: none arrives)."""
        seen = self.exports
        for _ in range(3 * EXPORT_INTERVAL_MS // 100):  # the receiver is a thread: polled, not awaited
            if self.exports > seen + 1:
                break
            await asyncio.sleep(0.1)
        return self.produce_requests()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def per_execution(
    line: dict[str, Any], idle_cpu: dict[str, float], idle_s: float, produce: float | None
) -> dict[str, Any]:
    """A rate's figures per execution from the run's line (see the module docstring)."""
    n = max(1, line["succeeded"])
    window = line["window_s"]
    cpu: dict[str, float] = line["cpu_s"]
    net = {name: max(0.0, used - idle_cpu.get(name, 0.0) * window / idle_s) for name, used in cpu.items()}
    return {
        "executions": line["succeeded"],
        "lost": line["lost"],
        "lateness_ms": line["lateness_ms"],
        "late_over_1s_by_cause": line["late_over_1s_by_cause"],
        "inserted_before_first_due_s": line["inserted_before_first_due_s"],
        "cpu_ms_per_execution": round(1000 * sum(cpu.values()) / n, 3),
        "net_cpu_ms_per_execution": round(1000 * sum(net.values()) / n, 3),
        "net_cpu_ms_per_execution_by_process": {name: round(1000 * s / n, 3) for name, s in net.items()},
        "machine_busy_ms_per_execution": round(1000 * line["machine_busy_s"] / n, 3),
        "idle_cpu_s_per_s": {name: round(s / idle_s, 4) for name, s in idle_cpu.items()},
        "statements_per_execution": round(line["postgres_calls"] / n, 2),
        "transactions_per_execution": round(line["postgres_transactions"] / n, 2),
        "produce_requests_per_execution": round(produce / n, 3) if produce is not None else None,
        "wal_bytes_per_execution": round(line["postgres_wal_bytes"] / n),
        # Per statement (calls, rows a call, time, blocks, WAL) and per table (rows inserted, updated, heap-only).
        "postgres_per_execution": postgres_costs.per_execution(
            line["postgres_statement_costs"], line["table_writes"], line["succeeded"]
        ),
        "window_s": window,
    }


async def run_rate(bench: Bench, counters: BrokerCounters, rate: int, args: argparse.Namespace) -> dict[str, Any]:
    n = max(1, round(rate * args.duration))
    bench.start()
    counters.reset()
    try:
        before = bench.cpu()
        await asyncio.sleep(args.idle)
        hz = os.sysconf("SC_CLK_TCK")
        idle_cpu = {name: (bench.cpu().get(name, used) - used).ticks / hz for name, used in before.items()}
        create_s = n / (CREATE_PER_S if args.create == "api" else 50_000)
        start = datetime.now(UTC) + timedelta(seconds=args.lead + create_s)
        due = [whole_ms(start + timedelta(seconds=args.duration * i / n)) for i in range(n)]
        produce_before = await counters.settled()
        line = await bench.run_dispatch("curve", due, create=args.create)
        produce_after = await counters.settled()
    finally:
        bench.stop()
    produce = produce_after - produce_before if produce_before is not None and produce_after is not None else None
    return {**per_execution(line, idle_cpu, args.idle, produce), "run": line}


async def main_async(args: argparse.Namespace) -> None:
    shape = Shape(
        args.shards, args.dispatchers, args.workers, args.concurrency, not args.no_durable, not args.no_analytics
    )
    ports = ports_at(args.port_offset)
    counters = BrokerCounters(ports.api + 46)
    # Tansu exports its request counters over OTLP when this is in its environment (the stack passes ours on).
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{ports.api + 46}"
    os.environ["OTEL_METRIC_EXPORT_INTERVAL"] = str(EXPORT_INTERVAL_MS)
    try:
        for rate in args.rates:
            bench = Bench(shape, args.root, ports)
            load = os.getloadavg()
            figures = await run_rate(bench, counters, rate, args)
            figures["load_avg_before"] = [round(x, 2) for x in load]
            figures["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
            settings = {**vars(shape), "rate_per_s": rate, "duration_s": args.duration}
            settings["created"] = "API batch" if args.create == "api" else "COPY"
            results.record("curve", figures, settings, results=args.results)
    finally:
        counters.close()
