"""Postgres: a private cluster per data directory, initialised with initdb and run as plain ``postgres``."""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shutil
import signal
import stat
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

from sundial_infra.process import ServerError, StopMode, pid_alive
from sundial_infra.servers.base import Server

log = logging.getLogger("sundial.infra")
# sun_path holds 108 bytes with its terminating NUL; Postgres refuses a longer socket path at start-up.
_MAX_SOCKET_PATH = 108


# POSIX ACLs as the kernel stores them in the ``system.posix_acl_access`` attribute (linux/posix_acl_xattr.h):
# a version word, then (tag, permissions, id) entries sorted by tag and id.
_ACL_XATTR = "system.posix_acl_access"
_ACL_VERSION = 2
_ACL_HEADER = struct.Struct("<I")
_ACL_ENTRY = struct.Struct("<HHI")
_ACL_USER_OBJ, _ACL_USER, _ACL_GROUP_OBJ, _ACL_GROUP, _ACL_MASK, _ACL_OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_ACL_UNDEFINED_ID = 0xFFFFFFFF
_ACL_EXECUTE = 0x1

#: Where Sundial kept clusters (linked from ``<data_dir>/pgdata``) before they moved into the data dir itself.
LEGACY_CLUSTERS_DIR_NAME = "sundial"


def _reachable(directory: Path, account: pwd.struct_passwd) -> bool:
    """Whether ``account`` can enter ``directory`` (asked of the kernel, so ACLs and groups count)."""
    result = subprocess.run(
        ["/bin/sh", "-c", 'cd -- "$1"', "sh", str(directory)],
        capture_output=True,
        check=False,
        user=account.pw_uid,
        group=account.pw_gid,
        extra_groups=[],
    )
    return result.returncode == 0


def _grant_search(path: Path, account: pwd.struct_passwd) -> None:
    """Let ``account`` traverse ``path`` (search only: it still cannot list it) with an ACL entry.

    ``chmod o+x`` would open the directory to every account; an ACL names the postgres account alone.
    Filesystems without ACLs get the chmod, with a warning saying so.
    """
    st = path.stat()
    entries: dict[tuple[int, int], int] = {}
    try:
        raw = os.getxattr(path, _ACL_XATTR)
    except OSError:
        raw = b""  # no ACL yet (ENODATA), or none supported (setxattr below says which)
    if raw:
        for offset in range(_ACL_HEADER.size, len(raw), _ACL_ENTRY.size):
            tag, perm, uid = _ACL_ENTRY.unpack_from(raw, offset)
            entries[(tag, uid)] = perm
    else:  # the ACL equivalent of the mode bits
        entries = {
            (_ACL_USER_OBJ, _ACL_UNDEFINED_ID): (st.st_mode >> 6) & 7,
            (_ACL_GROUP_OBJ, _ACL_UNDEFINED_ID): (st.st_mode >> 3) & 7,
            (_ACL_OTHER, _ACL_UNDEFINED_ID): st.st_mode & 7,
        }
    entries[(_ACL_USER, account.pw_uid)] = entries.get((_ACL_USER, account.pw_uid), 0) | _ACL_EXECUTE
    # The mask bounds every named entry and the owning group; as setfacl does, it is their union.
    entries[(_ACL_MASK, _ACL_UNDEFINED_ID)] = 0
    mask = 0
    for (tag, _), perm in entries.items():
        if tag in (_ACL_USER, _ACL_GROUP_OBJ, _ACL_GROUP):
            mask |= perm
    entries[(_ACL_MASK, _ACL_UNDEFINED_ID)] = mask
    acl = _ACL_HEADER.pack(_ACL_VERSION) + b"".join(
        _ACL_ENTRY.pack(tag, perm, uid) for (tag, uid), perm in sorted(entries.items())
    )
    try:
        os.setxattr(path, _ACL_XATTR, acl)
        log.info("granted the %s account search permission on %s (ACL u:%s:x)", account.pw_name, path, account.pw_name)
    except OSError as exc:
        path.chmod(stat.S_IMODE(st.st_mode) | stat.S_IXOTH)
        log.warning("no ACL on %s (%s): made it searchable by every account (o+x) instead", path, exc)


def grant_traversal(directory: Path, account: pwd.struct_passwd) -> None:
    """Make ``directory`` reachable by ``account`` by granting search on each ancestor that blocks it.

    Run as root from a checkout under ``/root`` (mode 0700), the ``postgres`` account cannot reach the
    cluster in the checkout's ``.sundial/``; this grants it search on ``/root`` (and whatever else is in
    the way) instead of keeping the cluster outside the checkout.
    """
    if _reachable(directory, account):
        return
    for path in (*reversed(directory.parents), directory):  # from / down: the first refusal is the culprit
        if not _reachable(path, account):
            _grant_search(path, account)
    if not _reachable(directory, account):
        raise ServerError(
            f"the {account.pw_name} OS account cannot reach {directory} even after granting it search "
            f"permission on the directories above it; move the checkout or give it access"
        )


def remove_legacy_clusters(home: Path, *, min_age_sec: float = 120.0) -> list[Path]:
    """Delete the clusters older Sundial versions kept in ``<postgres home>/sundial/<key>``; return them.

    A cluster whose postmaster still runs (another checkout on an older version) is kept, and so is one
    touched in the last ``min_age_sec`` (an initdb under way has no postmaster yet).
    """
    root = home / LEGACY_CLUSTERS_DIR_NAME
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    for cluster in root.iterdir():
        pgdata = cluster / "pgdata"
        newest = max((p.stat().st_mtime for p in (cluster, pgdata) if p.exists()), default=0.0)
        if time.time() - newest < min_age_sec or _postmaster_alive(pgdata):
            continue
        shutil.rmtree(cluster, ignore_errors=True)
        removed.append(cluster)
    with contextlib.suppress(OSError):
        root.rmdir()  # only if nothing is left in it
    return removed


def _postmaster_alive(pgdata: Path) -> bool:
    try:
        first = (pgdata / "postmaster.pid").read_text().split("\n", 1)[0].strip()
    except OSError:
        return False
    return first.isdigit() and pid_alive(int(first))


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
    def pgdata(self) -> Path:
        return self.data_dir / "pgdata"

    @property
    def socket_dir(self) -> Path | None:
        """The cluster's Unix socket directory, or None when its path would be too long for one.

        Clients connect over TCP; the socket is only for tools run by hand (``psql -h <data_dir>``).
        """
        socket = self.data_dir / f".s.PGSQL.{self.port}"
        return self.data_dir if len(str(socket)) < _MAX_SOCKET_PATH else None

    def _os_user(self) -> pwd.struct_passwd | None:
        """The OS account to run as, or None to run as ourselves (when not root)."""
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam("postgres")
        except KeyError as e:
            raise ServerError("running as root but there is no `postgres` OS user; run `make deps`") from e

    def _popen_kwargs(self) -> dict[str, Any]:
        account = self._os_user()
        if account is None:
            return {}
        # extra_groups=[] drops root's supplementary groups instead of leaking them to the server.
        return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}

    def _prepare(self) -> None:
        super()._prepare()
        account = self._os_user()
        self._adopt_legacy_cluster()
        if account is not None:
            grant_traversal(self.data_dir, account)
            os.chown(self.data_dir, account.pw_uid, account.pw_gid)
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
            cwd=self.data_dir,
            capture_output=True,
            text=True,
            check=False,
            **self._popen_kwargs(),
        )
        with open(self.log_file, "a") as f:
            f.write(result.stdout + result.stderr)
        if result.returncode != 0:
            raise ServerError(f"initdb failed ({result.returncode}):\n{result.stderr or result.stdout}")

    def _adopt_legacy_cluster(self) -> None:
        """Move a cluster an older Sundial kept outside the data dir (``pgdata`` was a link to it) back in."""
        link = self.pgdata
        if not link.is_symlink():
            return
        target = Path(os.readlink(link))
        link.unlink()
        if target.is_dir():
            shutil.move(target, link)
            log.info("moved the Postgres cluster from %s into %s", target, link)
            if target.parent.parent.name == LEGACY_CLUSTERS_DIR_NAME:  # <postgres home>/sundial/<key>
                shutil.rmtree(target.parent, ignore_errors=True)  # what is left: a stale socket lock
                with contextlib.suppress(OSError):
                    target.parent.parent.rmdir()  # once empty

    def _command(self) -> list[str]:
        settings = {
            "port": str(self.port),
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.socket_dir or ""),
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
            cwd=self.data_dir,
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
