"""The development environment behind ``sundial dev up``, in the foreground.

``DevRunner`` starts the ``LocalStack`` on ``DEV_PORTS``, applies migrations, mints the dev tokens,
supervises every Sundial process (:class:`sundial_infra.supervisor.Supervisor`), watches the servers,
prints a banner once ``/readyz`` answers, and tears everything down when told to stop. The command-line
side (detaching, ``down``, ``status``) lives in ``sundial_infra.cli``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from sundial_common.runtime import dev_stack

from sundial_infra.process import ServerError, read_pid_file, tail, write_pid_file
from sundial_infra.servers.base import Server
from sundial_infra.stack import DEV_PORTS, LocalStack, Ports
from sundial_infra.supervisor import Backoff, ProcessSpec, Supervisor, default_processes, gateway_port, sundial_argv

log = logging.getLogger("sundial.infra.dev")


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
    gateway = f"http://127.0.0.1:{gateway_port(stack.ports.api)}"
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
  Console    {api}/ui   (one-click sign-in as tenant demo from this machine)
  API        {api}   (OpenAPI: {api}/openapi.json)
  API docs   {api}/docs   (Swagger UI; ReDoc: {api}/redoc)
  Gateway    {gateway}   (workers in any language, holding only a pool token)
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
Serve a pool with your own handlers, from your project's directory (this stack is recorded in
{_display(dev_stack.pointer_path())}, so the worker finds it without any variable):
  {Path(sys.executable).with_name("sundial")} worker --app mymodule:worker
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
        backoff: Backoff = Backoff(),  # noqa: B008 - a frozen value
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
