"""``sundial dev``: the local development environment from the command line (``make run/up/down/status``).

This module owns the user-facing side of ``sundial_infra.dev_runner``: ``up`` in the foreground (the
supervisor runs in this process) or in the background (a detached supervisor, and ``up`` returns once
the API answers ``/readyz``), ``down`` (stop the supervisor, then anything a crash left behind), and
``status``, and ``clean`` (everything under the root stopped and deleted, with the Postgres clusters
older versions kept outside it). All four are idempotent and find the environment through the pid files under
``<root>/run`` and the servers' data directories, so they work from any shell. While the supervisor runs, the stack is
recorded in the per-user file of :mod:`sundial_common.runtime.dev_stack` (``~/.config/sundial/dev.json``), so that
``sundial worker`` started from any directory finds it; ``down`` removes the record.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import pwd
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from sundial_common.runtime import dev_stack
from sundial_common.runtime.stop_signals import StopSignals

from sundial_infra.dev_runner import (
    DevLayout,
    DevRunner,
    banner,
    failure_excerpt,
    log_tails,
    readyz_ok,
    supervisor_running,
)
from sundial_infra.process import marked_processes, read_pid_file, terminate, write_pid_file
from sundial_infra.servers.postgres import remove_legacy_clusters
from sundial_infra.stack import DEV_PORTS, LocalStack
from sundial_infra.supervisor import default_processes, sundial_argv

log = logging.getLogger("sundial.infra.cli")

_PROCESS_NAMES = tuple(spec.name for spec in default_processes())


def repo_root(start: Path | None = None) -> Path:
    """The nearest ancestor holding ``uv.lock`` (the workspace root), else the working directory."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "uv.lock").exists():
            return candidate
    return here


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--root",
        type=Path,
        default=Path(os.environ["SUNDIAL_DEV_ROOT"]) if os.environ.get("SUNDIAL_DEV_ROOT") else None,
        help="State directory: data, logs, pids, tokens (env SUNDIAL_DEV_ROOT; default <repo>/.sundial).",
    )
    parser = argparse.ArgumentParser(
        prog="sundial dev",
        description="Run Sundial locally: real Postgres, Redis, etcd and broker on loopback ports, "
        "plus api, the dispatchers, the hydrator, sweeper and replayer (two `sundial services` hosts), analytics and "
        "the demo workers (demo, staging-demo), all supervised.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{up,down,status,clean}")
    up = sub.add_parser("up", parents=[common], help="start everything (idempotent)")
    up.add_argument(
        "--foreground",
        action="store_true",
        help="stay attached; Ctrl-C or SIGTERM stops everything (default: detach once /readyz is 200)",
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=_env_float("SUNDIAL_DEV_UP_TIMEOUT", 180.0),
        help="seconds to wait for /readyz in background mode (env SUNDIAL_DEV_UP_TIMEOUT; default 180)",
    )
    down = sub.add_parser("down", parents=[common], help="stop everything (idempotent)")
    down.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds to let the supervisor shut down before killing it (default 60)",
    )
    sub.add_parser("status", parents=[common], help="show what runs")
    sub.add_parser(
        "clean",
        parents=[common],
        help="stop everything under the root (the dev stack, servers of killed test and bench runs) and delete it",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the local development environment: `sundial dev up | down | status`."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    layout = DevLayout((args.root or repo_root() / ".sundial").resolve())
    if args.command == "up":
        return up_foreground(layout) if args.foreground else up_background(layout, args.timeout)
    if args.command == "down":
        return down(layout, args.timeout)
    if args.command == "clean":
        return clean(layout)
    return status(layout)


@contextlib.contextmanager
def _up_lock(layout: DevLayout) -> Iterator[None]:
    """Serialises "is a supervisor running? if not, start one" between concurrent `up`s."""
    layout.run.mkdir(parents=True, exist_ok=True)
    with open(layout.run / "up.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held for milliseconds: the check and the pid file write
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def up_foreground(layout: DevLayout) -> int:
    with _up_lock(layout):
        pid = supervisor_running(layout)
        if pid is not None and pid != os.getpid():
            print(f"Sundial is already up (supervisor pid {pid}); `make down` stops it.")
            return 0
        write_pid_file(layout.supervisor_pid, os.getpid())
    stop, force = threading.Event(), threading.Event()
    # SIGHUP too: closing the terminal of `make run` must not orphan the servers. One Ctrl-C under
    # `make run` arrives twice (the terminal signals the whole group and `uv run` forwards it too);
    # StopSignals takes only a second press a moment later as "kill what is left".
    StopSignals(stop.set, force.set).install((signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
    runner = DevRunner(layout, announce=lambda text: print(text, flush=True))
    # So that `sundial worker` started from any directory finds this stack (sundial_common.runtime.dev_stack).
    pointer = dev_stack.record(layout.root, runner.stack.env(), os.getpid())
    log.info("recorded the stack in %s", pointer)
    try:
        return runner.run(stop, force)
    finally:
        dev_stack.forget(os.getpid())


def up_background(layout: DevLayout, timeout: float) -> int:
    stack = LocalStack(layout.root, DEV_PORTS, prometheus=True)
    ready_url = f"http://127.0.0.1:{DEV_PORTS.api}/readyz"
    with _up_lock(layout):
        pid = supervisor_running(layout)
        started = pid is None
        if pid is None:
            layout.logs.mkdir(parents=True, exist_ok=True)
            with open(layout.supervisor_log, "ab") as out:
                proc = subprocess.Popen(
                    [*sundial_argv("dev", "up", "--foreground", "--root", str(layout.root))],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # detached: survives this shell, and Ctrl-C here
                )
            pid = proc.pid
            # Recorded here as well as by the supervisor itself, so that a second `up` right now sees it.
            write_pid_file(layout.supervisor_pid, pid)
    if started:
        print(f"Starting Sundial in the background (supervisor pid {pid}, log {layout.supervisor_log})…")
    elif readyz_ok(ready_url):
        print(f"Sundial is already up (supervisor pid {pid}).")
        print(banner(layout, stack))
        return 0
    else:
        print(f"Sundial is starting (supervisor pid {pid}); waiting for {ready_url}…")

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if readyz_ok(ready_url):
            print(banner(layout, stack))
            return 0
        if supervisor_running(layout) is None:
            print(f"The supervisor exited before the API was ready:\n\n{failure_excerpt(layout)}")
            down(layout, 30.0, quiet=True)
            return 1
        threading.Event().wait(0.5)  # poll interval of the readiness loop
    print(
        f"The API did not answer {ready_url} within {timeout:.0f}s; stopping. Last log lines:\n\n"
        f"{_tails(layout)}\n\nFull logs: {layout.logs}/"
    )
    down(layout, 60.0, quiet=True)
    return 1


def _tails(layout: DevLayout) -> str:
    return log_tails(layout, ("supervisor", *_PROCESS_NAMES), lines=15)


def down(layout: DevLayout, timeout: float = 60.0, *, quiet: bool = False) -> int:
    stopped: list[str] = []
    pid = supervisor_running(layout)
    if pid is not None:
        dev_stack.forget(pid)  # the supervisor removes it too, unless it has to be killed
        if not quiet:
            print(f"Stopping the supervisor (pid {pid}) and everything it runs…")
        if not terminate(pid, timeout=timeout):
            print(f"The supervisor did not stop within {timeout:.0f}s and was killed; cleaning up after it.")
        stopped.append("supervisor")
    # Whatever a killed supervisor left behind: its children first, then the servers.
    for pid_file in sorted(layout.run.glob("*.pid")) if layout.run.exists() else []:
        child = read_pid_file(pid_file)
        if child is not None:
            terminate(child, timeout=15.0)
            stopped.append(pid_file.stem)
        pid_file.unlink(missing_ok=True)
    stack = LocalStack(layout.root, DEV_PORTS, prometheus=True)
    running_servers = [server.name for server, server_pid in stack.status() if server_pid is not None]
    stack.stop()
    stopped += running_servers
    if not quiet:
        print("Sundial is down." if stopped else "Sundial was not running.")
    return 0


# Their quick clean stop (as in each server's ``stop_signal``); everything else gets SIGTERM.
_STOP_SIGNALS = {"postgres": signal.SIGINT, "broker": signal.SIGINT}


def clean(layout: DevLayout) -> int:
    """Stop every process that runs from under ``layout.root`` and delete the root: all Sundial data.

    Besides the dev stack, the root holds the test sessions' stacks (``test/``, ``test-N/``) and the
    bench's (``bench*/``), which a killed run leaves running: they are found by their pid files and by the
    ``SUNDIAL_SERVER`` marker of servers whose pid files were wiped. As root, the Postgres clusters that
    older versions kept under the postgres account's home are deleted too.
    """
    root = layout.root
    if root == Path(root.anchor) or root == Path.home() or (repo_root() / "uv.lock").is_relative_to(root):
        print(f"Refusing to delete {root}: it is not a Sundial state directory.")
        return 2
    down(layout, quiet=True)
    pids: dict[int, str] = {}
    for pid_file in root.rglob("*.pid") if root.exists() else []:
        if pid_file.name != "postmaster.pid" and (pid := read_pid_file(pid_file)) is not None:
            pids[pid] = pid_file.stem
    for pid, marker in marked_processes():
        name, _, data_dir = marker.partition(":")
        if Path(data_dir).is_relative_to(root):
            pids[pid] = name
    for pid, name in pids.items():
        terminate(pid, sig=_STOP_SIGNALS.get(name, signal.SIGTERM), timeout=15.0)
    shutil.rmtree(root, ignore_errors=True)
    removed = [str(root)] if not root.exists() else []
    if os.geteuid() == 0:
        with contextlib.suppress(KeyError):
            removed += [str(p) for p in remove_legacy_clusters(Path(pwd.getpwnam("postgres").pw_dir))]
    if root.exists():
        print(f"Could not delete all of {root}; see what is left there.")
        return 1
    stopped = f"stopped {len(pids)} leftover process(es); " if pids else ""
    print(f"Sundial data removed ({stopped}deleted {', '.join(removed) or 'nothing'}).")
    return 0


def status(layout: DevLayout) -> int:
    stack = LocalStack(layout.root, DEV_PORTS, prometheus=True)
    rows: list[tuple[str, str, str]] = []
    supervisor = supervisor_running(layout)
    rows.append(("supervisor", _state(supervisor), str(layout.supervisor_log)))
    for server, pid in stack.status():
        rows.append((server.name, _state(pid), server.url))
    names = list(_PROCESS_NAMES)
    if layout.run.exists():
        names += sorted(p.stem for p in layout.run.glob("*.pid") if p.stem not in (*names, "supervisor"))
    for name in names:
        pid = read_pid_file(layout.run / f"{name}.pid")
        rows.append((name, _state(pid), str(layout.logs / f"{name}.log")))
    name_width = max(len(name) for name, _, _ in rows)
    state_width = max(len(state) for _, state, _ in rows)
    for name, state, where in rows:
        print(f"{name.ljust(name_width)}  {state.ljust(state_width)}  {where}")
    ready_url = f"http://127.0.0.1:{DEV_PORTS.api}/readyz"
    print(f"\nAPI {ready_url}: {'ready' if readyz_ok(ready_url) else 'not ready'}")
    if stack.prometheus is not None:
        ready = "ready" if stack.prometheus.is_ready() else "not ready"
        print(f"Prometheus {stack.prometheus.url}: {ready} (targets: {stack.prometheus.url}/targets)")
    return 0


def _state(pid: int | None) -> str:
    return f"running (pid {pid})" if pid is not None else "stopped"


if __name__ == "__main__":
    raise SystemExit(main())
