"""The process supervisor behind ``sundial dev up``: the local stack plus every Sundial process, kept alive.

This module owns two things:

* ``Supervisor`` — runs a table of ``ProcessSpec`` subprocesses, each in its own session with its log in
  ``<logs>/<name>.log`` and its pid in ``<run>/<name>.pid``; restarts any that exits (like systemd's
  ``Restart=always``) with exponential backoff that resets once a process has stayed up; stops them
  with SIGTERM, a grace period, then SIGKILL. The table is a parameter, so it is tested with fake
  commands.
* ``DevRunner`` — the whole development environment in the foreground: start the ``LocalStack`` on
  ``DEV_PORTS``, apply migrations, mint the dev tokens, supervise the processes, watch the servers, print
  a banner once ``/readyz`` answers, and tear everything down when told to stop.

The command-line side (detaching, ``down``, ``status``) lives in ``sundial_infra.cli``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sundial_infra.process import ServerError, read_pid_file, tail, write_pid_file
from sundial_infra.servers.base import Server
from sundial_infra.servers.prometheus import ScrapeTarget, write_targets
from sundial_infra.stack import DEV_METRICS_PORTS, DEV_PORTS, LocalStack, Ports

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


def default_processes(
    api_port: int = DEV_PORTS.api, metrics_ports: Sequence[int] = DEV_METRICS_PORTS
) -> tuple[ProcessSpec, ...]:
    """The Sundial processes of one development environment: HA out of the box.

    8 shards (the default ``SUNDIAL_SHARDS``) over two dispatcher replicas, and the hydrator, the sweeper and
    the replayer each in two hosts (``sundial services``, :mod:`sundial_common.commands.host`): each role is elected in
    one and stands by in the other; kill either host and the other leads every role (see the README's HA
    section). Hosted together because an idle Python process costs the same whatever it runs: two processes
    instead of six. Each replica serves ``/metrics`` on a port of ``metrics_ports`` of its own; the API on its
    HTTP port.
    """
    replicas = [
        ("services-1", "services", "--run", SINGLETONS),
        ("services-2", "services", "--run", SINGLETONS),
        ("dispatcher-1", "dispatcher"),
        ("dispatcher-2", "dispatcher"),
        ("worker", "worker", "--app", "sundial_worker.demo:worker"),
        ("worker-staging", "worker", "--app", "sundial_worker.demo:staging_worker"),
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


# --------------------------------------------------------------------------------------------------
# The development environment.
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DevLayout:
    """Where a development environment keeps its state (``.sundial/`` at the repo root by default)."""

    root: Path

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def supervisor_pid(self) -> Path:
        return self.run / "supervisor.pid"

    @property
    def supervisor_log(self) -> Path:
        return self.logs / "supervisor.log"

    @property
    def dev_token(self) -> Path:
        return self.root / "dev-token"

    @property
    def admin_token(self) -> Path:
        return self.root / "admin-token"


@dataclasses.dataclass(frozen=True)
class SetupStep:
    """A command run once before the processes start; its stdout (last line) optionally saved to a file."""

    name: str
    argv: tuple[str, ...]
    output: Path | None = None
    timeout: float = 120.0


def default_setup(layout: DevLayout) -> tuple[SetupStep, ...]:
    return (
        # The API serves registered tenants, and takes work only for registered pools they may use.
        SetupStep(
            "migrate",
            sundial_argv("migrate", "--tenant", "demo", "--pool", "demo=demo", "--staging-pool", "staging-demo=demo"),
        ),
        SetupStep("dev token", sundial_argv("token", "--tenant", "demo"), layout.dev_token),
        SetupStep("admin token", sundial_argv("token", "--tenant", "demo", "--admin"), layout.admin_token),
    )


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b.*:")


def _error_summary(output: str, lines: int = 12) -> str:
    """The last exception line of a traceback and a few after it (SQLAlchemy appends the SQL), else a tail."""
    text = output.rstrip().splitlines()
    found = [i for i, line in enumerate(text) if _EXCEPTION_LINE.match(line)]
    if found:
        return "\n".join(text[found[-1] : found[-1] + 4])
    return "\n".join(text[-lines:])


RUN_MARKER = "sundial dev up"  # opens each run in supervisor.log, so a failure report starts there


class SetupError(RuntimeError):
    pass


def readyz_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):  # refused, 503 (HTTPError), timeout
        return False


def _display(path: Path) -> str:
    """``path`` relative to the working directory when it is inside it (shorter, copy-pastable)."""
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    return str(path)


def banner(layout: DevLayout, stack: LocalStack) -> str:
    api = f"http://127.0.0.1:{stack.ports.api}"
    prometheus = (
        ""
        if stack.prometheus is None
        else f"\n  Prometheus {stack.prometheus.url}   (alerts: {stack.prometheus.url}/alerts)"
    )
    auth = f'-H "Authorization: Bearer $(cat {_display(layout.dev_token)})"'
    admin = f'-H "Authorization: Bearer $(cat {_display(layout.admin_token)})"'
    body = (
        '{"name":"hello","type":"DELAYED","delaySeconds":2,'
        '"target":{"pool":"demo","handler":"echo"},"payload":{"msg":"hi"}}'
    )
    return f"""
Sundial is up.
  API        {api}   (OpenAPI: {api}/openapi.json)
  Postgres   {stack.postgres_dsn}
  Redis      {stack.redis_url}
  etcd       {stack.etcd_endpoint}
  Kafka      {stack.kafka_bootstrap}{prometheus}
  logs       {_display(layout.logs)}/    pids {_display(layout.run)}/

Create a job that runs in 2 seconds on the demo worker:
  curl -s -X POST {api}/v1/jobs {auth} -H 'Content-Type: application/json' -d '{body}'
Then look at it and its execution (ids from the answers):
  curl -s {api}/v1/jobs/<job id> {auth}
  curl -s {api}/v1/executions/<execution id> {auth}
Who leads which shard (8 shards over 2 dispatcher replicas, standbys for the rest):
  SUNDIAL_ENV=dev .venv/bin/sundial cluster     or   curl -s {api}/v1/admin/cluster {admin}

Stop everything with `make down` (or Ctrl-C if you ran `make run`).
"""


class DevRunner:
    """Runs the development environment in the foreground until ``stop`` is set; see the module docstring."""

    def __init__(
        self,
        layout: DevLayout,
        *,
        ports: Ports = DEV_PORTS,
        durable: bool = True,
        processes: Sequence[ProcessSpec] | None = None,
        setup: Sequence[SetupStep] | None = None,
        backoff: Backoff = Backoff(),
        stop_timeout: float = 15.0,
        announce: Callable[[str], None] = print,
    ) -> None:
        self.layout = layout
        self.stack = LocalStack(layout.root, ports, durable=durable, prometheus=True)
        assert self.stack.prometheus is not None
        self.setup = tuple(default_setup(layout) if setup is None else setup)
        self.supervisor = Supervisor(
            default_processes(ports.api) if processes is None else processes,
            env=self.stack.env(),
            log_dir=layout.logs,
            run_dir=layout.run,
            backoff=backoff,
            stop_timeout=stop_timeout,
            targets_file=self.stack.prometheus.targets_dir / "sundial.json",
        )
        self.backoff = backoff
        self.announce = announce
        self.ready_url = f"http://127.0.0.1:{ports.api}/readyz"

    def _run_setup(self) -> None:
        env = {**os.environ, **self.stack.env()}
        for step in self.setup:
            log.info("running %s: %s", step.name, " ".join(step.argv))
            step_log = self.layout.logs / f"{step.name.replace(' ', '-')}.log"
            try:
                result = subprocess.run(
                    step.argv, env=env, capture_output=True, text=True, timeout=step.timeout, check=False
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise SetupError(f"{step.name} ({' '.join(step.argv)}) failed: {exc}") from exc
            # stderr only: stdout may be a token, which belongs in its 0600 file and nowhere else.
            step_log.write_text(result.stderr)
            if result.returncode != 0:
                raise SetupError(
                    f"{step.name} ({' '.join(step.argv)}) exited with code {result.returncode}:\n"
                    f"{_error_summary(result.stderr)}\n(full output: {_display(step_log)})"
                )
            if step.output is not None:
                lines = [line for line in result.stdout.splitlines() if line.strip()]
                if not lines:
                    raise SetupError(f"{step.name} printed nothing to save in {step.output}")
                step.output.parent.mkdir(parents=True, exist_ok=True)
                # Tokens are credentials: owner-only, created so, not chmod-ed after the fact.
                fd = os.open(step.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(lines[-1].strip() + "\n")

    def run(self, stop: threading.Event, force: threading.Event | None = None) -> int:
        """Bring everything up, supervise until ``stop``, tear down. Returns the process exit code."""
        self.layout.logs.mkdir(parents=True, exist_ok=True)
        write_pid_file(self.layout.supervisor_pid, os.getpid())
        code = 0
        try:
            log.info(
                "%s; starting Postgres, Redis, etcd, the broker and Prometheus under %s", RUN_MARKER, self.layout.root
            )
            self.stack.start()
            if not stop.is_set():
                self._run_setup()
            if not stop.is_set():
                self.supervisor.start()
                self._supervise(stop)
        except (ServerError, SetupError) as exc:
            log.error("%s", exc)
            code = 1
        finally:
            log.info("stopping processes")
            self.supervisor.stop(force)
            log.info("stopping servers")
            try:
                self.stack.stop()
            except ServerError as exc:
                log.error("%s", exc)
                code = 1
            if read_pid_file(self.layout.supervisor_pid) == os.getpid():
                self.layout.supervisor_pid.unlink(missing_ok=True)
            log.info("stopped")
        return code

    def _supervise(self, stop: threading.Event) -> None:
        """Until ``stop``: reap and restart the processes every second, check the servers every 5 s.

        Not every 0.2 s and every second (the Supervisor's default, and this loop's before): a crashed process
        waits its restart backoff (0.5 s and up) anyway, and a dead dev server is restarted a few seconds
        later; the ticks, each reading every child's and every server's state, were most of an idle ``make up``'s
        supervisor's CPU (idle bench: 0.0013-0.0017 of a core before, 0.0002-0.0003 after).
        """
        announced = False
        server_failures: dict[str, int] = {}
        server_retry_at: dict[str, float] = {}
        next_server_check = 0.0
        while not stop.is_set():
            self.supervisor.tick()
            now = time.monotonic()
            if not announced and readyz_ok(self.ready_url):
                announced = True
                self.announce(banner(self.layout, self.stack))
            if now >= next_server_check:
                next_server_check = now + 5.0
                for server in self.stack.servers:
                    self._watch_server(server, now, server_failures, server_retry_at)
            stop.wait(1.0)

    def _watch_server(self, server: Server, now: float, failures: dict[str, int], retry_at: dict[str, float]) -> None:
        """Servers get Restart=always too: a dev machine's Redis killed by the OOM killer comes back."""
        if server.is_running():
            return
        if now < retry_at.get(server.name, 0.0):
            return
        failures[server.name] = failures.get(server.name, 0) + 1
        log.warning("%s is not running; restarting it (attempt %d)", server.name, failures[server.name])
        try:
            server.start()
            failures[server.name] = 0
        except ServerError as exc:
            delay = self.backoff.delay(failures[server.name])
            retry_at[server.name] = time.monotonic() + delay
            log.error("%s failed to restart (next attempt in %.1fs): %s", server.name, delay, exc)


def supervisor_running(layout: DevLayout) -> int | None:
    """Pid of the live supervisor of ``layout``, if any."""
    return read_pid_file(layout.supervisor_pid)


def failure_excerpt(layout: DevLayout, lines: int = 30) -> str:
    """The first error of the supervisor's latest run and what follows it, else the log's tail."""
    text = tail(layout.supervisor_log, 400).splitlines()
    starts = [i for i, line in enumerate(text) if RUN_MARKER in line]
    run = text[starts[-1] :] if starts else text
    errors = [i for i, line in enumerate(run) if " ERROR " in line]
    excerpt = run[errors[0] : errors[0] + lines] if errors else run[-lines:]
    return f"==> {_display(layout.supervisor_log)} <==\n" + "\n".join(excerpt)


def log_tails(layout: DevLayout, names: Sequence[str], lines: int = 20) -> str:
    parts = []
    for name in names:
        path = layout.logs / f"{name}.log"
        if path.exists():
            parts.append(f"==> {_display(path)} <==\n{tail(path, lines)}")
    return "\n\n".join(parts)


__all__ = [
    "Backoff",
    "ChildStatus",
    "DevLayout",
    "DevRunner",
    "ProcessSpec",
    "SetupError",
    "SetupStep",
    "Supervisor",
    "banner",
    "default_processes",
    "default_setup",
    "failure_excerpt",
    "log_tails",
    "readyz_ok",
    "sundial_argv",
    "supervisor_running",
]
