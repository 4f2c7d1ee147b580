"""What a benchmark figure was measured on: the machine, its speed at the time, and the code's commit.

The commit is recorded only when it is known: the bench runs from a checkout without git installed, or
from an archive without ``.git``, and then records ``"commit": null`` rather than failing.
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any


def git_commit(repo: Path) -> str | None:
    """The short commit of ``repo`` (``-dirty`` if code changed), or None without git or outside a checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True)
        # Uncommitted changes to the code make the commit a lie; results files are the only expected change.
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", ".", ":!bench/results"], cwd=repo, capture_output=True, text=True
        )
    except OSError:  # no git executable
        return None
    if head.returncode != 0 or not head.stdout.strip():  # not a checkout
        return None
    return head.stdout.strip() + ("-dirty" if status.returncode == 0 and status.stdout.strip() else "")


def describe(repo: Path, *, cpu_probe: bool = True) -> dict[str, Any]:
    """Cores, memory, Python, the commit and (``cpu_probe``) the seconds a fixed piece of work took."""
    mem_kb = next(
        int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")
    )
    machine: dict[str, Any] = {}
    if cpu_probe:
        # A fixed piece of pure Python work: this VM's speed drifts (ceilings measured 25-40% apart within an
        # hour on an idle machine), so a figure reads against the speed of the machine when it was taken.
        started = time.perf_counter()
        sum(range(30_000_000))
        machine["cpu_probe_s"] = round(time.perf_counter() - started, 3)
    return {
        **machine,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1),
        "python": platform.python_version(),
        "commit": git_commit(repo),
    }


def cpu_ticks(pid: int) -> int:
    """utime + stime clock ticks of one process so far (its own, not its reaped children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def proc_table() -> tuple[dict[int, int], dict[int, int]]:
    """(parent of each pid, utime+stime ticks of each pid including its reaped children) from /proc."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        ticks[pid] = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    return parents, ticks
