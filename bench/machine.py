"""What a benchmark figure was measured on: the machine, its speed at the time, and the code's commit.

The commit is recorded only when it is known: the bench runs from a checkout without git installed, or
from an archive without ``.git``, and then records ``"commit": null`` rather than failing.
"""

from __future__ import annotations

import contextlib
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


def cpu_model() -> str | None:
    """The CPU's model name as the kernel reports it (``/proc/cpuinfo``), or None where it does not say."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return value.strip()
    return None


def describe(repo: Path, *, cpu_probe: bool = True) -> dict[str, Any]:
    """Cores, memory, CPU model, kernel, Python, the commit and (``cpu_probe``) the seconds a fixed piece of work
    took."""
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
        "cpu_model": cpu_model(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "commit": git_commit(repo),
    }


def busy_seconds() -> float:
    """The whole machine's non-idle CPU seconds so far, every core and every process (``/proc/stat``'s first line
    less idle and iowait): what a run costs the machine, its client and neighbours included."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> int:
    """utime + stime clock ticks of one process so far (its own, not its reaped children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


class Usage:
    """What a process (or a tree of them) has used so far: CPU clock ticks in user space and in the kernel
    (utime and stime, with its reaped children's), and the context switches of its live threads — voluntary (it
    blocked: a wait in epoll, a futex, a read) and involuntary (preempted: another runnable task took the core).

    The switches are summed over ``/proc/<pid>/task/*/status``: the kernel keeps no per-process total a reader
    can see, so an exited thread's or reaped child's switches are not counted (Postgres' backends and every
    process's threads live for a whole bench run; a thread started and ended within it is missed)."""

    __slots__ = ("involuntary", "system", "user", "voluntary")

    def __init__(self, user: int = 0, system: int = 0, voluntary: int = 0, involuntary: int = 0) -> None:
        self.user, self.system, self.voluntary, self.involuntary = user, system, voluntary, involuntary

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.user + other.user,
            self.system + other.system,
            self.voluntary + other.voluntary,
            self.involuntary + other.involuntary,
        )

    def __sub__(self, other: Usage) -> Usage:
        return Usage(
            self.user - other.user,
            self.system - other.system,
            self.voluntary - other.voluntary,
            self.involuntary - other.involuntary,
        )

    @property
    def ticks(self) -> int:
        return self.user + self.system


def proc_table() -> tuple[dict[int, int], dict[int, Usage]]:
    """(parent of each pid, user and system ticks of each pid including its reaped children) from /proc; the
    context switches are left at 0 (reading every thread of the machine is slow): :func:`with_switches` adds
    them for the pids a caller keeps."""
    parents: dict[int, int] = {}
    usage: dict[int, Usage] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        usage[pid] = Usage(user=int(fields[11]) + int(fields[13]), system=int(fields[12]) + int(fields[14]))
    return parents, usage


def with_switches(pid: int, usage: Usage) -> Usage:
    """``usage`` of ``pid`` with the voluntary and involuntary context switches of its live threads."""
    voluntary = involuntary = 0
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                for line in (task / "status").read_text().splitlines():
                    if line.startswith("voluntary_ctxt_switches:"):
                        voluntary += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        involuntary += int(line.split()[1])
    return Usage(usage.user, usage.system, voluntary, involuntary)


def usage_of_trees(roots: dict[int, str]) -> dict[str, Usage]:
    """The usage of each named process with its descendants, except those under another named process (a
    name owns its subtree: Postgres its backends), from one read of /proc."""
    parents, usage = proc_table()
    totals = dict.fromkeys(roots.values(), Usage())
    for pid, own in usage.items():
        if (name := owner(pid, parents, roots)) is not None:
            totals[name] += with_switches(pid, own)
    return totals


def owner(pid: int, parents: dict[int, int], roots: dict[int, str]) -> str | None:
    """The named process ``pid`` belongs to: itself or its nearest named ancestor."""
    seen = 0
    while pid > 1 and seen < 64:
        if pid in roots:
            return roots[pid]
        pid = parents.get(pid, 0)
        seen += 1
    return None


def cpu_fields(before: dict[str, Usage], after: dict[str, Usage], digits: int = 1) -> dict[str, Any]:
    """A result line's CPU fields from two :func:`usage_of_trees` reads: ``cpu_s`` (user + system seconds per
    process, as every line has had), its split ``cpu_user_s`` / ``cpu_sys_s``, and ``context_switches`` per process
    (``[voluntary, involuntary]``) with the stack's total."""
    hz = os.sysconf("SC_CLK_TCK")
    used = {name: after.get(name, start) - start for name, start in before.items()}
    switches = {name: [u.voluntary, u.involuntary] for name, u in used.items()}
    return {
        "cpu_s": {name: round(u.ticks / hz, digits) for name, u in used.items()},
        "cpu_user_s": {name: round(u.user / hz, digits) for name, u in used.items()},
        "cpu_sys_s": {name: round(u.system / hz, digits) for name, u in used.items()},
        "context_switches": switches,
        "context_switches_total": [sum(v for v, _ in switches.values()), sum(i for _, i in switches.values())],
    }
