"""Real Sundial processes as subprocesses for the e2e and fault tests: ``Processes`` starts ``sundial <command>``
with its own log and stops it (SIGTERM, then SIGKILL); ``free_port`` hands out this session's spare ports."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from sundial_infra.stack import TEST_PORTS

from tests.support.ports import port_offset

SUNDIAL = str(Path(sys.executable).with_name("sundial"))


#: Ports a test may give the processes it starts: this session's block just above its API port
#: (``TEST_PORTS.api + offset + 1 …``), which no port set uses. Never ``bind(0)``: the kernel picks those from
#: the ephemeral range, where any client socket of another process can take the port before ours listens.
FREE_PORTS = 19
_handed_out = itertools.count()


def free_port() -> int:
    """A loopback port nothing listens on, from this session's block (handed out in turn, so a process
    that is still stopping does not get its port reused at once)."""
    base = TEST_PORTS.api + port_offset() + 1
    for _ in range(FREE_PORTS):
        port = base + next(_handed_out) % FREE_PORTS
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"every port of {base}–{base + FREE_PORTS - 1} is in use")


class Processes:
    """Starts ``sundial <command>`` processes against the test stack and cleans them up."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        self.logs = logs
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        #: Where each process's current incarnation begins in its log (a restarted one appends to the same file).
        self._log_from: dict[str, int] = {}

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("ab")
        self._log_from[name] = log.tell()
        proc = subprocess.Popen(
            [SUNDIAL, *args],
            env={**self.env, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.running[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def wait_for_log(self, name: str, text: str, timeout: float = 60.0) -> None:
        """Wait for ``text`` in what the process's current incarnation logged (not a restarted one's earlier life)."""
        deadline = time.monotonic() + timeout
        path = self.logs / f"{name}.log"
        while time.monotonic() < deadline:
            with path.open("rb") as log:
                log.seek(self._log_from.get(name, 0))
                if text in log.read().decode(errors="replace"):
                    return
            proc = self.running[name]
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.log(name)[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"{name} did not log {text!r} within {timeout}s:\n{self.log(name)[-3000:]}")

    def wait_http_ok(self, name: str, url: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.running[name].poll() is not None:
                raise AssertionError(f"{name} exited:\n{self.log(name)[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"{url} not ready within {timeout}s:\n{self.log(name)[-3000:]}")

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        proc = self.running.pop(name)
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def stop_all(self, timeout: float = 20.0) -> None:
        """SIGTERM every process at once, then wait for each (SIGKILL at the deadline): they stop independently,
        and one by one a test's teardown paid every process's shutdown in turn (~29 s for the trace stories,
        whose processes flush spans to a receiver that is already closed)."""
        stopping = list(self.running.values())
        self.running.clear()
        for proc in stopping:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in stopping:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
