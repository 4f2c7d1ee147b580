"""The process supervisor: runs a table of ``ProcessSpec`` subprocesses and keeps them alive.

``Supervisor`` runs each process in its own session with its log in ``<logs>/<name>.log`` and its pid in
``<run>/<name>.pid``; restarts any that exits (like systemd's ``Restart=always``) with exponential backoff
that resets once a process has stayed up; stops them with SIGTERM, a grace period, then SIGKILL. The table
is a parameter, so it is tested with fake commands. ``default_processes`` is the table ``make up`` runs;
the development environment around it is :mod:`sundial_infra.dev_runner`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sundial_infra.process import write_pid_file
from sundial_infra.servers.prometheus import ScrapeTarget, write_targets
from sundial_infra.stack import DEV_METRICS_PORTS, DEV_PORTS

log = logging.getLogger("sundial.infra.supervisor")


def sundial_argv(*args: str) -> tuple[str, ...]:
    """argv that runs ``sundial <args>`` from this environment (the venv's script, else ``python -m``)."""
    script = Path(sys.executable).with_name("sundial")
    if script.exists():
        return (str(script), *args)
    return (sys.executable, "-m", "sundial_client.command", *args)


@dataclasses.dataclass(frozen=True)
class ProcessSpec:
    """One supervised process: a name (its log and pid file), its argv and environment variables of its own.

    ``scrape`` is where Prometheus finds its ``/metrics`` (None: not scraped).
    """

    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    scrape: ScrapeTarget | None = None

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"process name {self.name!r} must be a plain file name (it names the log)")
        if not self.argv:
            raise ValueError(f"process {self.name!r} has an empty argv")


def _replica(name: str, metrics_port: int, *command: str) -> ProcessSpec:
    # The process name doubles as the replica id in etcd, so `sundial cluster` names what `make status` shows,
    # and as the `instance` label of its series.
    env = (("SUNDIAL_INSTANCE_ID", name), ("SUNDIAL_METRICS_PORT", str(metrics_port)))
    scrape = ScrapeTarget(service=command[0], instance=name, address=f"127.0.0.1:{metrics_port}")
    return ProcessSpec(name, sundial_argv(*command), env=env, scrape=scrape)


SINGLETONS = "hydrator,sweeper,replayer"
"""The singleton services each ``services-N`` process of the development environment hosts."""


def gateway_port(api_port: int) -> int:
    """The worker gateway's HTTP port in the development stack: the one after the API's."""
    return api_port + 1


def default_processes(
    api_port: int = DEV_PORTS.api, metrics_ports: Sequence[int] = DEV_METRICS_PORTS
) -> tuple[ProcessSpec, ...]:
    """The Sundial processes of one development environment: HA out of the box.

    8 shards (the default ``SUNDIAL_SHARDS``) over two dispatcher replicas, and the hydrator, the sweeper and
    the replayer each in two hosts (``sundial services``, :mod:`sundial_common.commands.host`): each role is elected in
    one and stands by in the other; kill either host and the other leads every role (see
    docs/operations/high-availability.md). Hosted together because an idle Python process costs the same whatever
    it runs: two processes instead of six. Each replica serves ``/metrics`` on a port of ``metrics_ports`` of its
    own; the API on its HTTP port.
    """
    replicas = [
        ("services-1", "services", "--run", SINGLETONS),
        ("services-2", "services", "--run", SINGLETONS),
        ("dispatcher-1", "dispatcher"),
        ("dispatcher-2", "dispatcher"),
        ("worker", "worker", "--app", "sundial_worker.demo:worker"),
        ("worker-staging", "worker", "--app", "sundial_worker.demo:staging_worker"),
        # Workers in any language reach the pools through it, on the port after the API's.
        ("gateway", "gateway", "--host", "127.0.0.1", "--port", str(gateway_port(api_port))),
        # One replica: the embedded chDB engine's data (.sundial/analytics/chdb) belongs to one process.
        ("analytics", "analytics"),
    ]
    if len(replicas) > len(metrics_ports):
        raise ValueError(f"{len(replicas)} replicas need as many metrics ports, got {len(metrics_ports)}")
    api = ProcessSpec(
        "api",
        sundial_argv("api", "--host", "127.0.0.1", "--port", str(api_port)),
        env=(("SUNDIAL_INSTANCE_ID", "api"),),
        scrape=ScrapeTarget(service="api", instance="api", address=f"127.0.0.1:{api_port}"),
    )
    return (
        api,
        *(
            _replica(name, port, *command)
            for (name, *command), port in zip(replicas, metrics_ports[: len(replicas)], strict=True)
        ),
    )


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Restart delays: ``initial * factor**(n-1)`` for the n-th consecutive failure, capped at ``maximum``.

    A process that stayed up for ``healthy_after`` seconds starts again from ``initial``: a crash loop
    slows down, a process that crashes once a day restarts at once.
    """

    initial: float = 0.5
    factor: float = 2.0
    maximum: float = 30.0
    healthy_after: float = 30.0

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.maximum < self.initial:
            raise ValueError("Backoff needs 0 < initial <= maximum")
        if self.factor < 1:
            raise ValueError("Backoff.factor must be >= 1 (delays must not shrink)")

    def delay(self, consecutive_failures: int) -> float:
        exponent = max(0, consecutive_failures - 1)
        return min(self.maximum, self.initial * self.factor**exponent)


@dataclasses.dataclass
class _Child:
    spec: ProcessSpec
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    failures: int = 0
    restarts: int = 0
    restart_at: float | None = None


@dataclasses.dataclass(frozen=True)
class ChildStatus:
    name: str
    pid: int | None
    restarts: int
    next_restart_in: float | None


class Supervisor:
    """Keeps a table of processes running until ``stop()``; see the module docstring."""

    def __init__(
        self,
        processes: Sequence[ProcessSpec],
        *,
        env: Mapping[str, str],
        log_dir: Path,
        run_dir: Path,
        backoff: Backoff = Backoff(),
        stop_timeout: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
        targets_file: Path | None = None,
    ) -> None:
        names = [p.name for p in processes]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate process names in {names}")
        self.env = dict(env)
        self.log_dir = Path(log_dir)
        self.run_dir = Path(run_dir)
        self.backoff = backoff
        self.stop_timeout = stop_timeout
        self._clock = clock
        self._children = [_Child(spec) for spec in processes]
        self._stopping = False
        self.targets_file = targets_file

    def scrape_targets(self) -> list[ScrapeTarget]:
        return [c.spec.scrape for c in self._children if c.spec.scrape is not None]

    def pid_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def log_file(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._stopping = False
        if self.targets_file is not None:
            # From the process table, so a replica added there is scraped without a Prometheus config edit.
            write_targets(self.targets_file, self.scrape_targets())
        for child in self._children:
            if child.proc is None:
                self._spawn(child)

    def _note(self, child: _Child, message: str) -> None:
        """A line in the child's own log, so `tail -f` on it shows the supervisor's view too."""
        with contextlib.suppress(OSError), open(self.log_file(child.spec.name), "a") as f:
            f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} supervisor: {message}\n")

    def _spawn(self, child: _Child) -> None:
        spec = child.spec
        child.started_at = self._clock()
        child.restart_at = None
        env = {**os.environ, **self.env, **dict(spec.env), "PYTHONUNBUFFERED": "1"}
        self._note(child, f"starting {' '.join(spec.argv)}")
        try:
            with open(self.log_file(spec.name), "ab") as out:
                child.proc = subprocess.Popen(
                    spec.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    # Own session: Ctrl-C reaches the supervisor only, which then stops the children
                    # in order; stop() can also kill whatever a child forked.
                    start_new_session=True,
                )
        except OSError as exc:  # e.g. the executable is missing; treated like an immediate crash
            child.proc = None
            log.error("%s failed to start: %s", spec.name, exc)
            self._note(child, f"failed to start: {exc}")
            self._schedule_restart(child, f"failed to start ({exc})")
            return
        write_pid_file(self.pid_file(spec.name), child.proc.pid)
        log.info("%s started (pid %d)", spec.name, child.proc.pid)

    def _schedule_restart(self, child: _Child, why: str) -> None:
        now = self._clock()
        if now - child.started_at >= self.backoff.healthy_after:
            child.failures = 0
        child.failures += 1
        delay = self.backoff.delay(child.failures)
        child.restart_at = now + delay
        log.warning("%s %s; restarting in %.1fs (log: %s)", child.spec.name, why, delay, self.log_file(child.spec.name))
        self._note(child, f"{why}; restarting in {delay:.1f}s")

    def tick(self) -> None:
        """Reap exited processes and restart those whose backoff has elapsed. The loop calls this."""
        if self._stopping:
            return
        now = self._clock()
        for child in self._children:
            if child.proc is not None and (code := child.proc.poll()) is not None:
                child.proc = None
                self.pid_file(child.spec.name).unlink(missing_ok=True)
                uptime = now - child.started_at
                self._schedule_restart(child, f"exited with code {code} after {uptime:.1f}s")
            if child.proc is None and child.restart_at is not None and now >= child.restart_at:
                child.restarts += 1
                self._spawn(child)

    def run(self, stop: threading.Event, interval: float = 0.2) -> None:
        """Supervise until ``stop`` is set (does not stop the children: call ``stop()``)."""
        while not stop.is_set():
            self.tick()
            stop.wait(interval)

    def status(self) -> list[ChildStatus]:
        now = self._clock()
        return [
            ChildStatus(
                name=c.spec.name,
                pid=c.proc.pid if c.proc is not None and c.proc.poll() is None else None,
                restarts=c.restarts,
                next_restart_in=None if c.restart_at is None else max(0.0, c.restart_at - now),
            )
            for c in self._children
        ]

    def stop(self, force: threading.Event | None = None) -> None:
        """SIGTERM every child, wait up to ``stop_timeout`` (or until ``force``), SIGKILL the rest.

        Idempotent. All children get SIGTERM at once so the grace periods overlap.
        """
        self._stopping = True
        running = [c for c in self._children if c.proc is not None and c.proc.poll() is None]
        for child in running:
            assert child.proc is not None
            log.info("stopping %s (pid %d)", child.spec.name, child.proc.pid)
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        cut_short = force if force is not None else threading.Event()
        while any(c.proc is not None and c.proc.poll() is None for c in running):
            if time.monotonic() >= deadline or cut_short.is_set():
                break
            cut_short.wait(0.05)
        for child in self._children:
            if child.proc is not None:
                pid = child.proc.pid
                if child.proc.poll() is None:
                    log.warning(
                        "%s (pid %d) did not stop within %.0fs; killing it", child.spec.name, pid, self.stop_timeout
                    )
                    self._note(child, "did not stop in time; SIGKILL")
                # Kill the child's whole session: anything it forked must not outlive it.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.proc.wait(timeout=5)
                self._note(child, f"stopped (exit code {child.proc.returncode})")
                child.proc = None
            child.restart_at = None
            self.pid_file(child.spec.name).unlink(missing_ok=True)
