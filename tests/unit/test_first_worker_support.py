"""What lets a first worker start anywhere and explain its failures: the dev stack's record, and an attempt's
bounded log tail and traceback."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sundial_common.runtime import dev_stack
from sundial_common.runtime.settings import DEV_SIGNING_KEY, CommonSettings
from sundial_worker import log_tail
from sundial_worker.log_tail import MAX_CHARS, MAX_LINES, MAX_TRACEBACK_CHARS, TailingLogger, traceback_text
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


def test_the_log_tail_keeps_the_last_lines_within_its_bounds() -> None:
    logger = TailingLogger(logging.getLogger("test.tail"), {"tenant": "t"})
    logger.logger.setLevel(logging.INFO)
    assert logger.text() is None
    logger.debug("not enabled: not kept")
    for i in range(MAX_LINES + 50):
        logger.info("line %d", i)
    lines = (logger.text() or "").splitlines()
    assert len(lines) == MAX_LINES and lines[-1].endswith(f" INFO line {MAX_LINES + 49}")
    for _ in range(100):
        logger.warning("x" * 5000)
    text = logger.text() or ""
    assert len(text) <= MAX_CHARS and text.splitlines()[-1].endswith("…")
    try:
        raise ValueError("bad input")
    except ValueError:
        logger.exception("failed")
    assert (logger.text() or "").endswith("ERROR failed (ValueError: bad input)")


def test_a_traceback_keeps_its_innermost_frames() -> None:
    def inner() -> None:
        raise RuntimeError("x" * 20_000 + " at the bottom")

    try:
        inner()
    except RuntimeError as exc:
        text = traceback_text(exc)
    assert len(text) == MAX_TRACEBACK_CHARS and text.startswith("…")
    assert text.rstrip().endswith("x at the bottom")


def test_a_traceback_starts_at_the_handler_not_in_the_runtime_that_awaited_it() -> None:
    def handler() -> None:
        raise KeyError("missing")

    # The runtime catches a sync handler's exception where it reads the thread pool's future (execution.py).
    runtime = str(Path(log_tail.__file__).with_name("execution.py"))
    code = "def awaiting(future, describe):\n    try:\n        future.result()\n    except KeyError as exc:\n"
    namespace: dict[str, Any] = {}
    exec(compile(code + "        return describe(exc)\n", runtime, "exec"), namespace)
    with concurrent.futures.ThreadPoolExecutor(1) as threads:
        text = namespace["awaiting"](threads.submit(handler), traceback_text)
    frames = [line for line in text.splitlines() if line.startswith("  File ")]
    assert len(frames) == 1 and __file__ in frames[0], text
    assert text.startswith("Traceback (most recent call last):") and text.rstrip().endswith("KeyError: 'missing'")
