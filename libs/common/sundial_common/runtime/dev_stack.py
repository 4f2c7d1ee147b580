"""The running development stack's pointer: how a process started from any directory finds ``make up``'s stack.

``sundial dev up`` (``make up`` / ``make run``) records the stack it runs in a per-user file,
``$XDG_CONFIG_HOME/sundial/dev.json`` (``~/.config/sundial/dev.json`` by default): its state directory (the dev
root, where the development master key lives), the supervisor's pid, and the ``SUNDIAL_*`` variables that point a
process at it. ``sundial dev down`` removes it, and a record whose supervisor is gone is ignored, so a stale file
never points anywhere.

A command a user runs by hand (``sundial worker --app mymodule:worker`` from their own project) calls
:func:`use_running_stack` first: each of those variables the environment does not set is taken from the record.
Without it, such a command started outside the checkout would look for the dev root under its working directory
(``./.sundial``) and, finding none, could not open tenants' data. What the environment sets always wins, so a
production deployment (which sets its own database and key, and has no such file) is unaffected.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DevStack", "forget", "pointer_path", "record", "running", "use_running_stack"]

#: Variables of a record that a process may take (the connection strings, the dev flag and the dev root).
TAKEN = (
    "SUNDIAL_ENV",
    "SUNDIAL_DATABASE_URL",
    "SUNDIAL_REDIS_URL",
    "SUNDIAL_ETCD_ENDPOINT",
    "SUNDIAL_KAFKA_BOOTSTRAP",
    "SUNDIAL_DEV_ROOT",
)


@dataclass(frozen=True)
class DevStack:
    """A running development stack: its state directory, its supervisor's pid and the variables that reach it."""

    root: str
    pid: int
    env: dict[str, str]


def pointer_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/sundial/dev.json``, or ``~/.config/sundial/dev.json``."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "sundial" / "dev.json"


def record(root: Path, env: Mapping[str, str], pid: int, *, path: Path | None = None) -> Path:
    """Record the stack under ``root`` run by ``pid``; written whole (a reader never sees half a file)."""
    path = path or pointer_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"root": str(root), "pid": pid, "env": {k: v for k, v in env.items() if k in TAKEN}}
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(body, out, indent=2)
    os.replace(temporary, path)
    return path


def forget(pid: int, *, path: Path | None = None) -> None:
    """Remove the record if ``pid`` wrote it (a second stack's record is left alone)."""
    path = path or pointer_path()
    found = _read(path)
    if found is not None and found.pid == pid:
        path.unlink(missing_ok=True)


def running(*, path: Path | None = None) -> DevStack | None:
    """The recorded stack if its supervisor still runs, else None."""
    found = _read(path or pointer_path())
    if found is None:
        return None
    try:
        os.kill(found.pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, another user's: not ours to use
        return None
    return found


def use_running_stack(environ: MutableMapping[str, str] | None = None, *, path: Path | None = None) -> DevStack | None:
    """Fill the ``SUNDIAL_*`` variables ``environ`` lacks from the running dev stack's record; that stack, or None.

    Nothing is taken when the environment names a deployment of its own (``SUNDIAL_DATABASE_URL`` set, or
    ``SUNDIAL_ENV`` other than ``dev``): a half-configured mix of two stacks would be worse than either.
    """
    environ = os.environ if environ is None else environ
    if environ.get("SUNDIAL_ENV", "dev") != "dev" or environ.get("SUNDIAL_DATABASE_URL"):
        return None
    stack = running(path=path)
    if stack is None:
        return None
    for name, value in stack.env.items():
        if name in TAKEN:
            environ.setdefault(name, value)
    environ.setdefault("SUNDIAL_DEV_ROOT", stack.root)
    return stack


def _read(path: Path) -> DevStack | None:
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        body = json.loads(path.read_text())
        env = body.get("env") or {}
        return DevStack(root=str(body["root"]), pid=int(body["pid"]), env={str(k): str(v) for k, v in env.items()})
    return None
