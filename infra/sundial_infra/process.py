"""Process helpers shared by the servers, the stack and the supervisor.

This module owns how Sundial finds and stops its own long-lived processes: pid files that are trusted only
if their process started before the file was written (a guard against pid reuse after a reboot or a
crash), liveness checks through ``/proc``, graceful termination followed by SIGKILL of the process group,
polling with a deadline, and what a port is used by.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

StopMode = Literal["fast", "immediate"]


class ServerError(RuntimeError):
    """A server could not be prepared, started or stopped; the message says what to look at."""


MARKER_VAR = "SUNDIAL_SERVER"  # in each server's environment: which data dir it was started for
_PID_FILE_SLACK_SEC = 5.0  # btime has one-second resolution and the file is written just after spawn


@functools.cache  # fixed until the next boot; the supervisor's checks read it several times a second
def _boot_time() -> float:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise ServerError("cannot read boot time from /proc/stat")


def _process_state(pid: int) -> tuple[str, float] | None:
    """(state letter, start time as epoch seconds) of a process, or None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces and parentheses; the fields after the last ')'
    # are fixed: state is field 3, starttime field 22.
    fields = raw[raw.rindex(")") + 2 :].split()
    start_ticks = int(fields[19])
    return fields[0], _boot_time() + start_ticks / os.sysconf("SC_CLK_TCK")


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie; reaps it first if it is an exited child of ours."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    state = _process_state(pid)
    return state is not None and state[0] not in ("Z", "X")


def read_pid_file(path: Path) -> int | None:
    """The live pid recorded in ``path``, or None if the file is absent, stale or names a reused pid."""
    try:
        text = path.read_text().strip()
        written_at = path.stat().st_mtime
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not text.isdigit():
        return None
    pid = int(text)
    if not pid_alive(pid):
        return None
    state = _process_state(pid)
    if state is None or state[1] > written_at + _PID_FILE_SLACK_SEC:
        return None  # the pid was reused by a process started after we recorded ours
    return pid


def write_pid_file(path: Path, pid: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".pid.tmp")
    tmp.write_text(f"{pid}\n")
    tmp.replace(path)  # atomic: a concurrent reader sees the old pid or the new one, never half a file


def wait_for(
    predicate: Callable[[], bool],
    timeout: float,
    *,
    interval: float = 0.1,
    abort: Callable[[], str | None] | None = None,
) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` elapses; ``abort`` may end the wait early.

    ``abort`` returns a reason (e.g. "process exited") to raise ``ServerError`` with, or None to go on.
    """
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if abort is not None and (reason := abort()) is not None:
            raise ServerError(reason)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(interval, remaining))


def leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def terminate(
    pid: int,
    *,
    sig: signal.Signals = signal.SIGTERM,
    timeout: float = 15.0,
    force: threading.Event | None = None,
) -> bool:
    """Send ``sig`` to ``pid``, wait up to ``timeout`` for it to exit, then SIGKILL its process group.

    The graceful signal goes to the leader only, so it can shut its own children down in order; the
    group (all our processes lead their own session) is then killed so that nothing is left behind.
    Returns True if the process exited on its own. ``force`` (a second Ctrl-C) cuts the wait short.
    """
    if not pid_alive(pid):
        return True
    group = leads_group(pid)
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return True
    cut_short = force if force is not None else threading.Event()
    deadline = time.monotonic() + timeout
    graceful = True
    while pid_alive(pid):
        if cut_short.is_set() or time.monotonic() >= deadline:
            graceful = False
            break
        cut_short.wait(0.05)
    if group:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # the leader, if it lingers, and any orphaned children
    elif not graceful:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid), 5.0, interval=0.05)
    return graceful


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def describe_listener(port: int) -> str:
    """Whatever listens on ``port``, as ``pid N (command line)`` (as far as ``ss`` can tell)."""
    try:
        out = subprocess.run(
            ["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, timeout=5, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    pid = out.split("pid=", 1)[1].split(",", 1)[0] if "pid=" in out else ""
    if not pid.isdigit():
        return "another process"
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmdline = "?"
    return f"pid {pid} ({cmdline[:200]})"


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file, for error messages."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def marked_processes() -> Iterator[tuple[int, str]]:
    """(pid, ``<name>:<data_dir>``) of every live server that carries the ``SUNDIAL_SERVER`` marker.

    Servers get ``SUNDIAL_SERVER=<name>:<data_dir>`` in their environment, which identifies them with
    certainty even when their pid file is gone; only session leaders count (Postgres backends inherit it).
    """
    prefix = f"{MARKER_VAR}=".encode()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            values = [v for v in (proc / "environ").read_bytes().split(b"\0") if v.startswith(prefix)]
            if not values:
                # Redis rewrites its process title over its environment; the title carries the marker.
                title = (proc / "cmdline").read_bytes().rstrip(b"\0 ")
                if b" " + prefix in title:
                    values = [title.rsplit(b" ", 1)[1]]
        except OSError:  # exited meanwhile, or not ours to read
            continue
        if values and leads_group(pid := int(proc.name)) and pid_alive(pid):
            yield pid, values[0][len(prefix) :].decode(errors="replace")
