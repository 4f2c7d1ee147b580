"""The base of every local server: one process under a data directory, listening on one loopback port.

This module owns the start/stop contract the four servers share: ``start()`` and ``stop()`` are
idempotent and ``stop()`` is safe before ``start()``. Each server records its pid in
``<data_dir>/<name>.pid`` and runs in its own session, so a different process (``sundial dev down``, a
later test session) can find and stop it; a server whose pid file is lost is found again through the
``SUNDIAL_SERVER`` marker in its environment. Subclasses say how to prepare, launch and probe their server.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from sundial_infra.process import (
    MARKER_VAR,
    ServerError,
    StopMode,
    describe_listener,
    marked_processes,
    port_in_use,
    read_pid_file,
    tail,
    terminate,
    wait_for,
    write_pid_file,
)

log = logging.getLogger("sundial.infra")


class Server(ABC):
    """One server process under ``data_dir`` listening on ``127.0.0.1:port``."""

    name: ClassVar[str]
    #: Signal that asks the server for a clean shutdown.
    stop_signal: ClassVar[signal.Signals] = signal.SIGTERM

    def __init__(self, data_dir: Path, port: int, *, start_timeout: float = 60.0) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        # start/stop/restart may be called from several threads (LocalStack starts servers
        # concurrently, the supervisor watches them); one lifecycle operation at a time.
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.data_dir)!r}, {self.port})"

    # --- what subclasses define ------------------------------------------------------------------

    @property
    @abstractmethod
    def url(self) -> str:
        """How clients reach this server (a DSN, URL or host:port)."""

    @abstractmethod
    def _command(self) -> list[str]:
        """argv of the server process."""

    @abstractmethod
    def _probe(self) -> bool:
        """One readiness check; True when the server answers its own protocol."""

    def _ports(self) -> tuple[int, ...]:
        return (self.port,)

    def _prepare(self) -> None:
        """Create whatever the server needs on disk before it can start (idempotent)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)

    def _after_ready(self) -> None:
        """Provision the server once it answers (idempotent)."""
        return  # most servers need nothing; Postgres creates its role and database here

    def _popen_kwargs(self) -> dict[str, Any]:
        return {}

    def _cwd(self) -> Path:
        return self.data_dir

    # --- the start/stop contract -----------------------------------------------------------------

    @property
    def pid_file(self) -> Path:
        return self.data_dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.data_dir / f"{self.name}.log"

    @property
    def pid(self) -> int | None:
        """Pid of the running server, whether this object or another process started it."""
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None
        pid = read_pid_file(self.pid_file)
        if pid is None and (pid := self._find_by_marker()) is not None:
            write_pid_file(self.pid_file, pid)  # adopt a server whose pid file was lost
        return pid

    @property
    def _marker_value(self) -> str:
        return f"{self.name}:{self.data_dir}"

    def _find_by_marker(self) -> int | None:
        """A server started for this data dir whose pid file is gone (its directory was wiped, say).

        Each server carries ``SUNDIAL_SERVER=<name>:<data_dir>`` in its environment, which identifies it
        with certainty.
        """
        for pid, value in marked_processes():
            if value == self._marker_value:
                return pid
        return None

    def is_running(self) -> bool:
        return self.pid is not None

    def is_ready(self) -> bool:
        return self.is_running() and self._probe()

    def start(self) -> None:
        """Start the server (or adopt the one already running from this data dir) and wait until ready."""
        with self._lock:
            if self.pid is not None:
                self._wait_ready()
                self._after_ready()
                return
            for port in self._ports():
                if port_in_use(port):
                    raise ServerError(
                        f"{self.name}: port {port} is already in use by {describe_listener(port)}, which is not "
                        f"the server of {self.data_dir}; stop it (`make down` if it is a dev stack)"
                    )
            self._prepare()
            with open(self.log_file, "ab") as log_out:
                log_out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {self.name}\n".encode())
                log_out.flush()
                self._proc = subprocess.Popen(
                    self._command(),
                    stdin=subprocess.DEVNULL,
                    stdout=log_out,
                    stderr=subprocess.STDOUT,
                    cwd=self._cwd(),
                    # Own session: Ctrl-C in a terminal does not reach the server, and stop() can
                    # signal the whole process group (postgres backends, etc.).
                    start_new_session=True,
                    env={**os.environ, MARKER_VAR: self._marker_value},
                    **self._popen_kwargs(),
                )
            write_pid_file(self.pid_file, self._proc.pid)
            log.info("%s starting (pid %d, port %d, log %s)", self.name, self._proc.pid, self.port, self.log_file)
            self._wait_ready()
            self._after_ready()
            log.info("%s ready at %s", self.name, self.url)

    def _wait_ready(self) -> None:
        def exited() -> str | None:
            if self.pid is None:
                return f"{self.name} exited during start-up; last lines of {self.log_file}:\n{tail(self.log_file)}"
            return None

        if not wait_for(self._probe, self.start_timeout, abort=exited):
            raise ServerError(
                f"{self.name} did not become ready on port {self.port} within {self.start_timeout:.0f}s; "
                f"last lines of {self.log_file}:\n{tail(self.log_file)}"
            )
        # The probe may have been answered by a foreign server that grabbed the port between our
        # port check and our bind; ours then dies on "address in use".
        if (reason := exited()) is not None:
            raise ServerError(reason)

    def _stop_signal_for(self, mode: StopMode) -> signal.Signals:
        return self.stop_signal if mode == "fast" else signal.SIGKILL

    def stop(self, mode: StopMode = "fast", timeout: float = 20.0) -> None:
        """Stop the server if it runs, whoever started it; idempotent.

        ``fast``: the server's clean-stop signal, then SIGKILL of its process group after ``timeout``.
        ``immediate``: no clean shutdown (Postgres: SIGQUIT, its own immediate mode; others: SIGKILL).
        """
        with self._lock:
            pid = self.pid
            if pid is not None:
                sig = self._stop_signal_for(mode)
                if sig == signal.SIGKILL:
                    terminate(pid, sig=sig, timeout=0.0)
                    log.info("%s killed", self.name)
                elif terminate(pid, sig=sig, timeout=timeout):
                    log.info("%s stopped", self.name)
                else:
                    log.warning("%s (pid %d) ignored %s for %.0fs; killed", self.name, pid, sig.name, timeout)
            if self._proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=1)
                self._proc = None
            self.pid_file.unlink(missing_ok=True)

    def restart(self, mode: StopMode = "fast") -> None:
        with self._lock:
            self.stop(mode)
            self.start()
