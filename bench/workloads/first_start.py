"""A burst's first pass in the fair buffer: the CPU spent at the due instant before its first transaction can begin.

A burst claimed ahead (``FairnessConfig.claim_ahead_*``) waits in a shard leader's buffer until its instant; there
the first pass moves it into the fair queue and takes its head (``burst_head``). A dispatcher process leads four of
W1 100,000's eight shards, 12,500 occurrences each, and the four passes run one after the other in its event loop
before the group commit can begin their shared transaction. This measures one shard's part in CPU time (a loaded
machine's waits left out), two ways: one by one (a heap entry per occurrence, queued one at a time: the earlier code)
and by arrival (:class:`~sundial_dispatcher.fairness.EarlyWork`): holding the burst (paid
ahead, when it is claimed), moving it into the queue at the instant, and taking the head. Records; never fails.

    uv run --frozen python -m bench first-start [--burst 12500] [--repeat 7]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from sundial_common.stores.types import Occurrence
from sundial_dispatcher.fairness import EarlyWork, FairQueue, Waiting


def _one_by_one(items: list[Waiting], queue: FairQueue) -> tuple[float, float]:
    arrivals = itertools.count()
    early: list[tuple[datetime, int, Waiting]] = []
    started = time.process_time()
    for w in items:
        heapq.heappush(early, (w.occurrence.due, next(arrivals), w))
    held = time.process_time()
    due = items[0].occurrence.due
    moved: list[Waiting] = []
    while early and early[0][0] <= due:
        moved.append(heapq.heappop(early)[2])
    queue.add(moved)
    return held - started, time.process_time() - held


def _by_arrival(items: list[Waiting], queue: FairQueue) -> tuple[float, float]:
    early = EarlyWork()
    started = time.process_time()
    early.push(items)
    held = time.process_time()
    for arrival in early.pop_due(items[0].occurrence.due):
        queue.add_arrival(arrival)
    return held - started, time.process_time() - held


def _one(burst: int, way: Callable[[list[Waiting], FairQueue], tuple[float, float]]) -> tuple[float, float, float]:
    due = datetime.now(UTC)
    items = [Waiting(Occurrence(uuid.uuid4(), due), "bench", "bench") for _ in range(burst)]
    queue = FairQueue()
    held, moved = way(items, queue)
    started = time.process_time()
    queue.take(16, {}, {}, {}, default_pool_room=1000)
    return held, moved, time.process_time() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench first-start", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--burst", type=int, default=12_500, help="occurrences of one shard due at one instant")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    for label, way in (("one by one", _one_by_one), ("by arrival", _by_arrival)):
        runs = [_one(args.burst, way) for _ in range(args.repeat)]  # alternating would mix their garbage
        stages = ("held (ahead)", "moved at the instant", "head taken")
        for name, values in zip(stages, zip(*runs, strict=True), strict=True):
            ms = sorted(v * 1000 for v in values)
            print(f"{label}, {name}: min {ms[0]:.2f} / median {statistics.median(ms):.2f} / max {ms[-1]:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
