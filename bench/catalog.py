"""The names ``python -m bench`` knows: the workloads of ``make bench``'s run, the other workloads and the tools.

A name maps to the module that runs it; the module is imported only when its name is run, so ``--help`` does not
import every service the workloads reach into.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """One name of the command line: the module whose ``main(argv)`` runs it, and its line of ``--help``."""

    module: str
    summary: str


#: The workloads of :mod:`bench.suite` (``make bench``), run together on one stack shape and one set of options.
SUITE = {
    "idle": "the `make up` stack doing nothing: CPU per process over 60 s, memory",
    "idle-floor": "the same servers alone, no Sundial process: the floor under idle (not in the default)",
    "ceilings": "the raw parts: Postgres batched inserts, Redis ZADD and claim, broker produce/consume",
    "create": "API create rate under wrk: single POSTs (with and without Idempotency-Key) and batches",
    "w1": "burst: N one-shot jobs all due at the same instant",
    "w2": "spread: 20,000 jobs due uniformly over 60 s",
    "w3": "sustained: a target rate of due executions per second",
    "curve": "the cost curve: one spread at several rates, CPU, statements and produce requests per execution",
    "w4": "at rest: N future recurring jobs; hydrator passes; table and index sizes",
}

#: The other workloads and the tools, each with options of its own (``python -m bench NAME --help``).
COMMANDS = {
    "analytics": Entry("bench.workloads.analytics", "the ClickHouse replica: ingest rate, freshness, stats queries"),
    "at-rest": Entry("bench.workloads.at_rest", "W4 alone, with --keep and --reuse for 10M-job runs"),
    "breaker": Entry("bench.workloads.breaker", "a retry storm of a failing handler, with the breaker and without"),
    "console": Entry("bench.workloads.console", "the web console's pages at 100k jobs / 1M executions of a tenant"),
    "bulk": Entry("bench.workloads.bulk", "a bulk re-drive of 100,000 DEAD executions beside another tenant"),
    "census": Entry("bench.workloads.census", "the fair pass's census of open executions under churn"),
    "cli-help": Entry("bench.workloads.cli_help", "how long `sundial --help` takes, a new process each time"),
    "delivery": Entry("bench.workloads.delivery", "CPU per outbound HTTP request of the delivery module"),
    "dependencies": Entry("bench.workloads.dependencies", "a parent's completion to its children's executions"),
    "dispatch-insert": Entry("bench.workloads.dispatch_insert", "the dispatch statements against an earlier commit's"),
    "dispatch-python": Entry("bench.workloads.dispatch_python", "the dispatch pass's own Python per execution"),
    "dropped": Entry("bench.workloads.dropped", "how long an execution whose message the broker dropped waits"),
    "failover": Entry("bench.workloads.failover", "how long a shard goes without dispatching when its leader dies"),
    "fairness": Entry("bench.workloads.fairness", "tenant fairness under a stampede, fairness on and off"),
    "job-retention": Entry("bench.workloads.job_retention", "the sweeper's job-retention loop per job deleted"),
    "priority": Entry("bench.workloads.priority", "a tenant's HIGH jobs while its LOW backlog drains"),
    "publish-requests": Entry("bench.workloads.publish_requests", "produce requests per published batch"),
    "replay": Entry("bench.workloads.replay", "messages a second the replayer scans and re-publishes"),
    "storage": Entry("bench.workloads.storage", "the three writes of an execution, partitioned by day or not"),
    "worker-python": Entry("bench.workloads.worker_python", "the worker's own Python per execution"),
    # Tools: they print what they see and record nothing.
    "broker-requests": Entry("bench.workloads.broker_requests", "tool: the broker's requests by type (OTLP sink)"),
    "consumer-churn": Entry("bench.workloads.consumer_churn", "tool: delivery while consumers join, leave, crash"),
    "first-start": Entry("bench.workloads.first_start", "tool: a burst's first pass in the fair buffer"),
    "otlp-sink": Entry("bench.workloads.otlp_sink", "tool: an OTLP/HTTP trace sink that counts and keeps nothing"),
    "threads": Entry("bench.workloads.threads", "tool: a running bench stack's CPU thread by thread"),
}


def command(name: str) -> Callable[[list[str] | None], int]:
    """The ``main`` of the command ``name`` (underscores read as hyphens); :class:`KeyError` if there is none."""
    module = importlib.import_module(COMMANDS[name.replace("_", "-")].module)
    main: Callable[[list[str] | None], int] = module.main
    return main


def usage() -> str:
    """The names, one a line with what each runs: the text of ``python -m bench --help``."""
    width = max(map(len, [*SUITE, *COMMANDS])) + 2
    lines = [
        "usage: python -m bench [WORKLOAD ...] [options]     make bench's run (default: all but idle-floor)",
        "       python -m bench NAME [options]               another workload or a tool",
        "",
        "make bench's workloads (options: python -m bench w1 --help):",
        *(f"  {name:<{width}}{summary}" for name, summary in SUITE.items()),
        "",
        "other workloads and tools (options: python -m bench NAME --help):",
        *(f"  {name:<{width}}{entry.summary}" for name, entry in COMMANDS.items()),
        "",
        "Each run appends one JSON line to bench/results/<workload>.jsonl (see bench/results.py).",
    ]
    return "\n".join(lines)
