"""How long ``sundial --help`` takes, a new process each time: ``python -m bench cli-help``.

A user's first command, and every script's ``--help``: the time is Python's start, the entry point's lookup and the
imports of the command's parser. ``--help`` imports no server-side module (a unit test checks the imported modules);
this records what that buys, as the user sees it (wall time of the whole process, started from the virtualenv's
``sundial`` script), for the top-level help and one resource command's (``sundial jobs --help``).

Each command runs ``--runs`` times after one unmeasured warm-up (which fills the OS file cache, as any second run
on a user's machine would); min, median, p95 and max in milliseconds. Prints one JSON line and records it. A
benchmark records; it never passes or fails.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import results
from bench.results import REPO, RESULTS

SUNDIAL = Path(sys.executable).parent / "sundial"
COMMANDS = {"help": ["--help"], "jobs_help": ["jobs", "--help"]}


def _time(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([str(SUNDIAL), *argv], check=True, stdout=subprocess.DEVNULL, cwd=REPO)
    return (time.perf_counter() - started) * 1000


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {
        "min": round(ordered[0], 1),
        "p50": round(statistics.median(ordered), 1),
        "p95": round(p95, 1),
        "max": round(ordered[-1], 1),
    }


def measure(runs: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for name, argv in COMMANDS.items():
        _time(argv)  # warm-up: the file cache
        figures[f"{name}_ms"] = _summary([_time(argv) for _ in range(runs)])
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench cli-help", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="Measured runs of each command (default 20).")
    parser.add_argument("--results", type=Path, default=RESULTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not SUNDIAL.exists():
        parser.error(f"no `sundial` script beside {sys.executable}: run it as .venv/bin/python -m bench cli-help")
    results.record("cli-help", measure(args.runs), {"runs": args.runs}, results=args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
