"""The dev stack's record (how a process started anywhere finds ``make up``'s stack), and the signing-key rule a
worker is exempt from."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sundial_common.runtime import dev_stack
from sundial_common.runtime.settings import DEV_SIGNING_KEY, CommonSettings
from sundial_worker.settings import WorkerSettings

ENV = {"SUNDIAL_ENV": "dev", "SUNDIAL_DATABASE_URL": "postgresql://x@127.0.0.1:1/x", "SUNDIAL_JWT_SECRET": "no"}


def test_the_record_of_a_running_stack_fills_only_what_the_environment_lacks(tmp_path: Path) -> None:
    path = tmp_path / "sundial" / "dev.json"
    dev_stack.record(tmp_path / "root", ENV, os.getpid(), path=path)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    environ = {"SUNDIAL_LOG_LEVEL": "DEBUG"}
    stack = dev_stack.use_running_stack(environ, path=path)
    assert stack is not None and stack.root == str(tmp_path / "root")
    # Only the connection strings, the dev flag and the dev root; never a secret.
    assert environ == {
        "SUNDIAL_LOG_LEVEL": "DEBUG",
        "SUNDIAL_ENV": "dev",
        "SUNDIAL_DATABASE_URL": ENV["SUNDIAL_DATABASE_URL"],
        "SUNDIAL_DEV_ROOT": str(tmp_path / "root"),
    }
    # A deployment of its own is left alone.
    for own in ({"SUNDIAL_DATABASE_URL": "postgresql://prod/db"}, {"SUNDIAL_ENV": "production"}):
        before = dict(own)
        assert dev_stack.use_running_stack(own, path=path) is None and own == before
    dev_stack.forget(os.getpid() + 1, path=path)  # another stack's supervisor: not ours to remove
    assert path.exists()
    dev_stack.forget(os.getpid(), path=path)
    assert not path.exists() and dev_stack.use_running_stack({}, path=path) is None


def test_a_record_whose_supervisor_is_gone_is_ignored(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path = dev_stack.record(tmp_path, ENV, int(gone.stdout), path=tmp_path / "dev.json")
    assert dev_stack.running(path=path) is None
    (tmp_path / "dev.json").write_text("{not json")
    assert dev_stack.running(path=path) is None


def test_a_worker_is_not_refused_the_development_signing_key_but_the_api_is() -> None:
    assert WorkerSettings(env="production", jwt_secret=DEV_SIGNING_KEY).jwt_secret == DEV_SIGNING_KEY
    with pytest.raises(ValueError, match="development signing key"):
        CommonSettings(env="production", jwt_secret=DEV_SIGNING_KEY)
