"""Where the API is and who you are, for every ``sundial`` API command — and the error a command line or a
configuration that cannot work raises (:class:`UsageError`).

First found wins:

1. ``--url`` / ``--token`` (or ``--token-file``);
2. ``SUNDIAL_URL`` / ``SUNDIAL_TOKEN``;
3. the config file ``$SUNDIAL_CONFIG``, else ``$XDG_CONFIG_HOME/sundial/config.toml`` (``~/.config/…``):
   ``url = "https://sundial.example.com"`` and ``token = "…"`` or ``token_file = "/path"``;
4. the development stack: ``http://127.0.0.1:8080`` and the token ``make up`` writes in its state directory —
   ``dev-token`` (tenant ``demo``), or ``admin-token`` for the admin commands — in ``$SUNDIAL_DEV_ROOT``, else
   the nearest ``.sundial/`` from the current directory upwards.

With no token anywhere, the command stops before sending anything and says where it looked.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8080"
DEV_ROOT = ".sundial"
TENANT_TOKEN = "dev-token"
ADMIN_TOKEN = "admin-token"
USAGE = 2
AUTH = 6


class UsageError(Exception):
    """A command line or a configuration that cannot work: one line for the user, and the exit code."""

    def __init__(self, message: str, code: int = USAGE) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Connection:
    url: str
    token: str | None


def config_file(env: dict[str, str]) -> Path:
    if "SUNDIAL_CONFIG" in env:
        return Path(env["SUNDIAL_CONFIG"])
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "sundial" / "config.toml"


def dev_roots(env: dict[str, str], start: Path) -> list[Path]:
    """The development stack's state directories to look in, in order."""
    if env.get("SUNDIAL_DEV_ROOT"):
        return [Path(env["SUNDIAL_DEV_ROOT"])]
    return [directory / DEV_ROOT for directory in (start, *start.parents)]


def read_token(path: str | Path) -> str:
    try:
        return Path(path).expanduser().read_text().strip()
    except OSError as exc:
        raise UsageError(f"cannot read the token file {path}: {exc.strerror}") from None


def no_token(env: dict[str, str], config: Path, start: Path, name: str) -> UsageError:
    where = (
        f"$SUNDIAL_DEV_ROOT/{name} ({env['SUNDIAL_DEV_ROOT']})"
        if env.get("SUNDIAL_DEV_ROOT")
        else f"{DEV_ROOT}/{name} in {start} and every directory above it"
    )
    return UsageError(
        "a bearer token is required, and none was found; looked at --token, --token-file, $SUNDIAL_TOKEN, "
        f"the config file {config} (token, token_file) and {where}. Pass --token or set SUNDIAL_TOKEN "
        "(`sundial token --tenant T` mints one where the signing key is), or start the development stack "
        f"(`make up` writes {DEV_ROOT}/{TENANT_TOKEN} and {DEV_ROOT}/{ADMIN_TOKEN}).",
        AUTH,
    )


def resolve_connection(
    args: argparse.Namespace, env: dict[str, str] | None = None, cwd: Path | None = None, *, admin: bool = False
) -> Connection:
    """The API's URL and token from flags, environment, config file or the dev stack, in that order; ``admin``
    picks the dev stack's admin token."""
    env = dict(os.environ) if env is None else env
    start = cwd or Path.cwd()
    config: dict[str, Any] = {}
    path = config_file(env)
    if path.is_file():
        try:
            config = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, OSError) as exc:
            raise UsageError(f"config file {path}: {exc}") from None
    url = args.url or env.get("SUNDIAL_URL") or config.get("url") or DEFAULT_URL
    if args.token:
        return Connection(str(url), args.token)
    if args.token_file:
        return Connection(str(url), read_token(args.token_file))
    if env.get("SUNDIAL_TOKEN"):
        return Connection(str(url), env["SUNDIAL_TOKEN"])
    if config.get("token"):
        return Connection(str(url), str(config["token"]))
    if config.get("token_file"):
        return Connection(str(url), read_token(str(config["token_file"])))
    name = ADMIN_TOKEN if admin else TENANT_TOKEN
    for root in dev_roots(env, start):
        if (root / name).is_file():
            return Connection(str(url), read_token(root / name))
    raise no_token(env, path, start, name)
