"""W3's ladder: of a run's rates, the highest one the stack sustains, and what an execution costs on the way.

``python -m bench w3 --rates 500,1000,1500,2000,2500`` runs each rate on a fresh stack; :func:`summary` then reads
those runs' figures and gives one line:

``sustainable_per_s``
    the highest rate of the ladder whose P95 lateness stays at or under :data:`SUSTAINABLE_P95_MS` and whose every
    execution succeeded (None: not even the lowest);
``at_1000_ms``
    lateness P50/P95/P99 at 1,000/s, if the ladder has that rate;
``cpu_ms_per_execution``
    per rate, CPU milliseconds per execution of the processes an execution's start and finish pass through —
    workers, worker gateways (through the gateway transport) and Postgres;
``load_1m``
    per rate, the machine's 1-minute load average as the run began and ended: on a shared machine, other work
    shows here and the figures beside it are to be read with it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

#: A rate is sustained while its P95 lateness stays at or under this.
SUSTAINABLE_P95_MS = 500.0
#: The processes counted in an execution's CPU: by name, as the bench's supervisor names them.
PATH_PROCESSES = ("worker-", "gateway-", "postgres")


def load_1m() -> float:
    return round(os.getloadavg()[0], 2)


def cpu_ms_per_execution(figures: Mapping[str, Any]) -> float | None:
    executions = int(figures.get("succeeded") or 0)
    if not executions:
        return None
    cpu: Mapping[str, float] = figures.get("cpu_s", {})
    seconds = sum(float(value) for name, value in cpu.items() if name.startswith(PATH_PROCESSES))
    return round(seconds * 1000 / executions, 3)


def summary(transport: str, runs: Sequence[tuple[int, Mapping[str, Any]]]) -> dict[str, Any]:
    """The ladder's line from ``runs``: (target rate per second, that run's figures), in any order."""
    ordered = sorted(runs, key=lambda run: run[0])
    sustained = [
        rate
        for rate, figures in ordered
        if figures["lateness_ms"]["p95"] <= SUSTAINABLE_P95_MS
        and not figures.get("lost")
        and figures.get("succeeded") == figures.get("jobs")
    ]
    at_1000 = next((figures["lateness_ms"] for rate, figures in ordered if rate == 1000), None)
    return {
        "ladder": "w3",
        "worker_transport": transport,
        "rates_per_s": [rate for rate, _ in ordered],
        "sustainable_per_s": max(sustained, default=None),
        "p95_ms": {rate: figures["lateness_ms"]["p95"] for rate, figures in ordered},
        "at_1000_ms": None if at_1000 is None else {q: at_1000[q] for q in ("p50", "p95", "p99")},
        "cpu_ms_per_execution": {rate: cpu_ms_per_execution(figures) for rate, figures in ordered},
        "load_1m": {rate: figures.get("load_1m") for rate, figures in ordered},
    }
