"""The dispatch pass's own Python per execution, without I/O: CPU microseconds to plan a batch of due one-shot jobs
(the catch-up and overlap policies, execution ids, the dispatch span and traceparent), build the dispatch
insert's and the jobs' advance arrays, the Kafka messages (body and headers) and end the spans.

What a W3 run cannot tell apart on a shared 2-core machine (its neighbours move the dispatchers' CPU per execution
by ±20 % between two runs of the same code): this is one process, no servers, the figure moves only with the
machine's speed (the pure-Python probe is recorded beside it). Tracing as a process without an exporter sets it up;
the collector as ``sundial dispatcher`` sets it up (what startup built frozen; its young-generation threshold, if the
CLI sets one).

    uv run --frozen python -m bench dispatch-python [--batch 40] [--passes 2000]

Prints one JSON line (appended to ``bench/results/dispatch-python.jsonl``).
"""

from __future__ import annotations

import argparse
import gc
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sundial_common.domain.ids import new_id
from sundial_common.observability.tracing import setup_tracing
from sundial_common.runtime.service import prepare_collector
from sundial_dispatcher.cli import GC_THRESHOLD
from sundial_dispatcher.dispatcher import DispatcherConfig
from sundial_dispatcher.occurrences import OccurrencePlanner, occurrence_message

from bench import results


def _job(due: datetime) -> dict[str, Any]:
    """A locked due ONE_SHOT job as ``lock_due_jobs`` returns it (the columns the pass reads)."""
    return {
        "id": new_id(),
        "tenant_id": "acme",
        "type": "ONE_SHOT",
        "state": "ACTIVE",
        "next_fire_at": due,
        "next_nominal_at": due,
        "run_at": due,
        "timezone": "UTC",
        "schedule": None,
        "interval_sec": None,
        "run_list": None,
        "start_at": None,
        "end_at": None,
        "max_runs": None,
        "jitter_sec": 0,
        "fire_count": 0,
        "overlap_policy": "ALLOW",
        "catchup_policy": "FIRE_ONCE",
        "catchup_window_sec": 60,
        "open_execution_ids": None,
        "trigger_at": None,
        "trigger_execution_id": None,
        "trigger_traceparent": None,
        "claimed_due": due,
        "retry_policy": None,
        "pool": "demo",
        "handler": "echo",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "timeout_sec": 60,
        "payload": "sdl1:" + "x" * 60,
        "priority": "NORMAL",
    }


def measure(batch: int, passes: int) -> float:
    """CPU microseconds per execution of ``passes`` passes of ``batch`` jobs each."""
    now = datetime.now(UTC)
    jobs = [_job(now - timedelta(milliseconds=5)) for _ in range(batch)]
    config = DispatcherConfig(shards=8)

    def one_pass() -> None:
        planner = OccurrencePlanner(now=now, config=config)
        plan = planner(jobs)
        planned = plan.executions
        # The arrays PostgresDispatchStore.dispatch_occurrences sends (insert_executions, with the jobs' moves).
        _ = [p.job["id"] for p in planned]
        _ = [(p.execution_id, p.nominal, p.due, p.state, p.triggered, p.note, p.traceparent) for p in planned]
        _ = [(a.job_id, a.prev_fire_at, a.next_fire_at, a.next_nominal_at, a.runs, a.advance) for a in plan.advances]
        for message in [occurrence_message(p, 7, None) for p in planned]:
            message.encode()
            message.headers()
        for span in planner.spans.values():
            span.end()

    for _ in range(max(1, passes // 20)):
        one_pass()
    started = time.process_time()
    for _ in range(passes):
        one_pass()
    return (time.process_time() - started) / (passes * batch) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench dispatch-python", description=__doc__)
    parser.add_argument("--batch", type=int, default=40, help="jobs per pass")
    parser.add_argument("--passes", type=int, default=2000)
    parser.add_argument("--results", type=Path, default=results.RESULTS)
    args = parser.parse_args(argv)
    setup_tracing("bench", None)  # as a process without SUNDIAL_OTLP_ENDPOINT
    prepare_collector(GC_THRESHOLD)  # as the service's CLI runs it
    settings = {"batch": args.batch, "passes": args.passes, "gc_threshold": gc.get_threshold()[0]}
    figures = {"us_per_execution": round(measure(args.batch, args.passes), 1)}
    results.record("dispatch-python", figures, settings, results=args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
