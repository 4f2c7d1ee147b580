"""Postgres: a private cluster per data directory, initialised with initdb and run as plain ``postgres``."""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import shutil
import signal
import stat
import subprocess
from pathlib import Path
from typing import Any

from sundial_infra.process import ServerError, StopMode
from sundial_infra.servers.base import Server


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
