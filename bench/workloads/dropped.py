"""How long an execution whose message the broker dropped waits: ``python -m bench dropped --port-offset 300``.

The broker (Tansu, memory storage) rarely drops a message it acknowledged; a W2 run had one, started 62.9 s late.
Drops cannot be made on demand, but what Sundial sees of one can: an execution PENDING, marked published, whose
message is in no partition. This takes executions that already SUCCEEDED during a steady load (W3 at ``--rate``)
and moves each to its next attempt, PENDING and marked published — a retry dispatched and then dropped by the
broker — without publishing anything, then times how long until each has started again (its new ``started_at``
less the instant it was "dropped"). Nothing but the sweeper can start them again: that is what is measured.

``--at-end`` drops them once the load is over and every execution has finished instead: a burst's last messages,
with nothing published after them (the case a consumer group's progress alone cannot bound: no later batch).

Prints one JSON line (recovery seconds: min, median, max; the sweeper's log lines about them) and records it with
the harness's lines. A benchmark records; it never passes or fails.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from bench import results
from bench.harness import Bench, Shape, ports_at, spread
from bench.results import REPO, RESULTS

#: Moves SUCCEEDED executions to their next attempt, PENDING and published now, as a retry whose message the broker
#: acknowledged and dropped (dispatch.sql's dispatch_retries, then the dispatcher's mark_published). The attempt
#: row of the new attempt is the worker's to write when it starts it.
DROP = """
UPDATE executions SET state = 'PENDING', attempt = attempt + 1, worker_id = NULL, started_at = NULL,
       finished_at = NULL, result = NULL, pending_since = now(), published_at = now()
WHERE id IN (SELECT id FROM executions WHERE tenant_id LIKE 'bench-w3-%' AND phase = 'SUCCEEDED'
             ORDER BY finished_at DESC LIMIT $1)
RETURNING id, published_at"""


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    shape = Shape(8, 2, 2, 256, True, False, 0)
    bench = Bench(shape, args.root, ports_at(args.port_offset))
    bench.start()
    try:
        load = asyncio.create_task(
            bench.run_dispatch("w3", spread(int(args.rate * args.duration), args.duration, lead=3.0))
        )
        conn = await asyncpg.connect(bench.stack.postgres_dsn)
        try:
            if args.at_end:
                await load  # the load over and settled: nothing is published after the drops
            else:
                await asyncio.sleep(3.0 + args.duration / 3)  # the load well under way
            dropped = {r["id"]: r["published_at"] for r in await conn.fetch(DROP, args.drops)}
            deadline = time.monotonic() + args.wait
            started: dict[Any, datetime] = {}
            while len(started) < len(dropped) and time.monotonic() < deadline:
                rows = await conn.fetch(
                    "SELECT id, started_at FROM executions WHERE id = ANY($1::uuid[]) AND started_at IS NOT NULL",
                    list(dropped),
                )
                started = {r["id"]: r["started_at"] for r in rows}
                await asyncio.sleep(0.5)
        finally:
            await conn.close()
        await load  # (already over with --at-end)
    finally:
        bench.stop()
    waits = sorted((started[i] - dropped[i]) / timedelta(seconds=1) for i in started)
    log = (args.root / "logs" / "sweeper.log").read_text(errors="replace").splitlines()
    return {
        "dropped": len(dropped),
        "started_again": len(started),
        "recovery_s": {
            "min": round(waits[0], 2) if waits else None,
            "median": round(statistics.median(waits), 2) if waits else None,
            "max": round(waits[-1], 2) if waits else None,
        },
        "sweeper_republished": [line for line in log if re.search(r"republished [1-9]", line)][-5:],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench dropped", description=__doc__)
    parser.add_argument("--port-offset", type=int, default=0)
    parser.add_argument("--rate", type=int, default=1000, help="W3 executions a second meanwhile")
    parser.add_argument("--duration", type=float, default=45.0, help="seconds of W3 load")
    parser.add_argument(
        "--at-end", action="store_true", help="drop them after the load has ended (nothing published afterwards)"
    )
    parser.add_argument("--drops", type=int, default=20, help="executions dropped")
    parser.add_argument("--wait", type=float, default=90.0, help="seconds to wait for them at most")
    parser.add_argument("--root", type=Path, default=REPO / ".sundial" / "bench-dropped")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    line = asyncio.run(measure(args))
    settings = {"rate_per_s": args.rate, "duration_s": args.duration, "at_end": args.at_end}
    results.record("dropped", line, settings, results=args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
