"""Every byte of Sundial's state lives under the checkout's ``.sundial/``, and ``sundial dev clean`` removes it all.

Run as root, Postgres runs as the ``postgres`` account, which cannot enter a checkout under ``/root``
(mode 0700); the cluster used to be kept under that account's home instead and was left behind by
``make clean``. These tests pin down where the cluster is, that a closed directory above it is opened to
the postgres account alone, and that ``clean`` stops what a killed run left and deletes everything.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sundial_infra.process import pid_alive, wait_for, write_pid_file
from sundial_infra.servers.postgres import PostgresServer, remove_legacy_clusters
from sundial_infra.stack import LocalStack

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root runs Postgres as another account")


@pytest.fixture
def scratch(stack: LocalStack) -> Iterator[Path]:
    """A directory under the session's state root (so a killed run's leftovers are `make clean`'s)."""
    path = stack.root / f"scratch-{os.getpid()}-{time.monotonic_ns()}"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_postgres_cluster_lives_in_its_data_dir_under_the_stack_root(stack: LocalStack) -> None:
    served = Path(stack.postgres.psql("SHOW data_directory").strip())
    assert served == stack.root / "postgres" / "pgdata"
    assert not stack.postgres.pgdata.is_symlink()
    assert (stack.postgres.pgdata / "PG_VERSION").is_file()


@as_root
def test_as_root_a_cluster_below_a_directory_closed_to_postgres_is_made_in_place(scratch: Path) -> None:
    closed = scratch / "closed"  # like /root: mode 0700, owned by root
    closed.mkdir(mode=0o700)
    server = PostgresServer(closed / "postgres", port=1, durable=False)  # never started: no port needed

    server._prepare()  # what start() does before launching: initdb as the postgres account

    account = pwd.getpwnam("postgres")
    assert (server.pgdata / "PG_VERSION").is_file()
    assert not server.pgdata.is_symlink()
    assert server.pgdata.stat().st_uid == account.pw_uid
    # Opened to the postgres account alone (an ACL entry), not to every account.
    assert stat.S_IMODE(closed.stat().st_mode) & 0o077 == 0o010  # ls shows the ACL mask as group --x
    assert os.getxattr(closed, "system.posix_acl_access")
    other = subprocess.run(["/bin/sh", "-c", f"cd {closed}"], user="nobody", capture_output=True, check=False)
    assert other.returncode != 0, "an account other than postgres can enter the closed directory"


@as_root
def test_a_cluster_an_older_version_kept_outside_the_data_dir_is_moved_into_it(scratch: Path, tmp_path: Path) -> None:
    legacy = tmp_path / "postgres-home" / "sundial" / "0123456789ab" / "pgdata"
    legacy.mkdir(parents=True)
    (legacy / "PG_VERSION").write_text("15\n")  # a cluster, as far as _prepare is concerned
    data_dir = scratch / "postgres"
    data_dir.mkdir()
    (data_dir / "pgdata").symlink_to(legacy)

    PostgresServer(data_dir, port=1)._prepare()

    assert not (data_dir / "pgdata").is_symlink()
    assert (data_dir / "pgdata" / "PG_VERSION").read_text() == "15\n"
    assert not (tmp_path / "postgres-home" / "sundial").exists()


def test_legacy_clusters_are_removed_unless_running_or_just_made(tmp_path: Path) -> None:
    clusters = tmp_path / "sundial"
    old, running, fresh = (clusters / name / "pgdata" for name in ("old", "running", "fresh"))
    for pgdata in (old, running, fresh):
        pgdata.mkdir(parents=True)
    (running / "postmaster.pid").write_text(f"{os.getpid()}\n{running}\n")
    an_hour_ago = time.time() - 3600
    for path in (old, old.parent, running, running.parent):
        os.utime(path, (an_hour_ago, an_hour_ago))

    removed = remove_legacy_clusters(tmp_path)

    assert removed == [old.parent]
    assert sorted(p.name for p in clusters.iterdir()) == ["fresh", "running"]


def test_clean_stops_what_a_killed_run_left_and_deletes_the_root(scratch: Path) -> None:
    root = scratch / "state"
    # A server whose pid file was wiped (found by its marker) and a supervised process with its pid file.
    server = subprocess.Popen(
        ["sleep", "300"], start_new_session=True, env={**os.environ, "SUNDIAL_SERVER": f"redis:{root}/test/redis"}
    )
    process = subprocess.Popen(["sleep", "300"], start_new_session=True)
    write_pid_file(root / "bench" / "run" / "worker-0.pid", process.pid)
    (root / "test" / "postgres" / "pgdata").mkdir(parents=True)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "sundial_infra.cli", "clean", "--root", str(root)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert wait_for(lambda: not pid_alive(server.pid) and not pid_alive(process.pid), timeout=10)
        assert not root.exists()
    finally:
        for child in (server, process):
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def test_clean_refuses_a_root_that_holds_the_checkout(scratch: Path) -> None:
    checkout = scratch / "checkout"  # a stand-in: were the guard broken, only this would go
    (checkout / "sub").mkdir(parents=True)
    (checkout / "uv.lock").write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "sundial_infra.cli", "clean", "--root", str(checkout)],
        cwd=checkout / "sub",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, (checkout / "uv.lock").exists()) == (2, True), done.stdout + done.stderr
    assert "Refusing" in done.stdout
