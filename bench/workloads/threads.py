"""Where a running bench stack's CPU goes, thread by thread: user and kernel time and context switches.

    uv run --frozen python -m bench threads --parent PID --busy worker --delay 5 --seconds 15

Beside a running ``python -m bench`` (``--parent`` its pid: every process it started, with their children, is
looked at), waits ``--delay`` seconds, reads ``/proc/<pid>/task/*/stat`` and ``status`` of every thread, waits
``--seconds``, reads them again and prints one JSON line: per process (named by its command line's ``sundial``
subcommand or its executable), its threads grouped by name (``comm``: librdkafka's ``rdk:*``, gRPC's
``grpc_global_tim`` / ``default-executo``, the event loop's ``python``), each with user and system CPU in seconds
voluntary / involuntary context switches and minor page faults (``minflt``: memory first touched, mapped in by
the kernel). A measurement, not a test; it adds nothing to the stack.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench import machine


def _descendants(parent: int) -> list[int]:
    parents, _ = machine.proc_table()
    found, stack = [], [parent]
    while stack:
        pid = stack.pop()
        children = [child for child, p in parents.items() if p == pid]
        found.extend(children)
        stack.extend(children)
    return found


def _name(pid: int) -> str:
    """``<sundial subcommand>-<pid>`` for a Sundial process (``worker-123``), else its executable's name."""
    with contextlib.suppress(OSError):
        words = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
        if words and words[0].startswith("postgres: "):  # a Postgres child: its kind, every client backend as one
            title = words[0].removeprefix("postgres: ").split()
            return "postgres: client backends" if "(" in words[0] else f"postgres: {' '.join(title[:2])}"
        for i, word in enumerate(words[:-1]):
            if Path(word).name == "sundial":
                return f"{words[i + 1]}-{pid}"
        return Path(words[0]).name if words else str(pid)
    return str(pid)


def _threads(pid: int) -> dict[int, tuple[str, list[int]]]:
    """Each live thread of ``pid``: (comm, [user ticks, system ticks, voluntary, involuntary, minor faults])."""
    threads: dict[int, tuple[str, list[int]]] = {}
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                head, rest = (task / "stat").read_text().rsplit(")", 1)
                fields = rest.split()
                status = (task / "status").read_text()
                voluntary = int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
                involuntary = int(re.search(r"^nonvoluntary_ctxt_switches:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
                comm = head.split("(", 1)[1]
                threads[int(task.name)] = (
                    comm,
                    [int(fields[11]), int(fields[12]), voluntary, involuntary, int(fields[7])],
                )
    return threads


def snapshot(parent: int) -> dict[int, tuple[str, dict[int, tuple[str, list[int]]]]]:
    return {pid: (_name(pid), _threads(pid)) for pid in _descendants(parent)}


def _wait_busy(parent: int, name: str, cores: float) -> None:
    """Until the processes whose name contains ``name`` use ``cores`` together over each of 3 seconds in a row,
    counted once they have run 15 s (their start-up, imports and connections, is busy too): W3's run began."""
    previous, busy, first_seen = None, 0, None
    hz = os.sysconf("SC_CLK_TCK")
    while busy < 3:
        time.sleep(1.0)
        pids = [pid for pid in _descendants(parent) if name in _name(pid)]
        if not pids:
            previous, busy, first_seen = None, 0, None
            continue
        first_seen = first_seen or time.monotonic()
        _, usage = machine.proc_table()
        ticks = sum(usage[pid].ticks for pid in pids if pid in usage)
        settled = time.monotonic() - first_seen >= 15
        busy = busy + 1 if settled and previous is not None and (ticks - previous) / hz >= cores else 0
        previous = ticks


def measure(parent: int, delay: float, seconds: float, busy: str | None = None) -> dict[str, Any]:
    if busy:
        _wait_busy(parent, busy, 0.3)
    time.sleep(delay)
    before, started = snapshot(parent), time.monotonic()
    time.sleep(seconds)
    after, elapsed = snapshot(parent), time.monotonic() - started
    hz = os.sysconf("SC_CLK_TCK")
    processes: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0, 0, 0, 0, 0]))
    for pid, (name, threads) in after.items():
        old = before.get(pid, (name, {}))[1]
        key = name
        for tid, (comm, now) in threads.items():
            was = old.get(tid, (comm, [0, 0, 0, 0, 0]))[1]
            row = processes[key][re.sub(r"\d+$", "N", comm)]
            row[0] += (now[0] - was[0]) / hz
            row[1] += (now[1] - was[1]) / hz
            row[2] += now[2] - was[2]
            row[3] += now[3] - was[3]
            row[4] += 1
            row[5] += now[4] - was[4]
    out: dict[str, Any] = {}
    for name, rows in processes.items():
        threads_out = {
            comm: {
                "user_s": round(r[0], 2),
                "sys_s": round(r[1], 2),
                "vcsw": r[2],
                "ivcsw": r[3],
                "minflt": r[5],
                "threads": r[4],
            }
            for comm, r in sorted(rows.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
        }
        out[name] = {
            "user_s": round(sum(r[0] for r in rows.values()), 2),
            "sys_s": round(sum(r[1] for r in rows.values()), 2),
            "vcsw": sum(r[2] for r in rows.values()),
            "ivcsw": sum(r[3] for r in rows.values()),
            "minflt": sum(r[5] for r in rows.values()),
            "threads": threads_out,
        }
    return {
        "seconds": round(elapsed, 1),
        "processes": dict(sorted(out.items(), key=lambda kv: -(kv[1]["user_s"] + kv[1]["sys_s"]))),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench threads", description=__doc__.split("\n\n")[0])
    parser.add_argument("--parent", type=int, required=True, help="The pid whose descendants are measured.")
    parser.add_argument("--delay", type=float, default=20.0, help="Seconds to wait before the first read.")
    parser.add_argument("--seconds", type=float, default=15.0, help="Seconds between the two reads.")
    parser.add_argument(
        "--busy", help="First wait until the processes whose name contains this use 0.3 core (e.g. worker)."
    )
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.parent, args.delay, args.seconds, args.busy)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
