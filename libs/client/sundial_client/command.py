"""The ``sundial`` command: one front door for every Sundial process and for the tenant's CLI.

It lives in the client package because that is the one package every installation has: a tenant service
that installs only ``sundial-client`` (httpx and pydantic, no server code) gets ``sundial jobs …`` and
``sundial executions …``, and a server installation (``sundial-common`` depends on the client) gets the
same command with ``api``, ``worker``, ``migrate``… added. Two packages declaring the same console script
would overwrite each other's file, so exactly one does.

This module owns only the dispatch and needs nothing but the standard library; ``sundial --help`` describes each
command from its source (no command is imported), so it is quick. Each workspace member
registers its subcommands as entry points in
the group ``sundial.commands`` (``api = "sundial_api.cli:main"``); ``sundial <name> args...`` loads
entry point ``<name>`` and calls it with the remaining arguments as ``main(argv) -> int``. Nothing here
imports a service eagerly, so ``sundial worker`` does not pay for FastAPI and a broken member only breaks
its own command.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, entry_points, version
from pathlib import Path

GROUP = "sundial.commands"

CommandMain = Callable[[list[str]], int | None]


def discover() -> dict[str, EntryPoint]:
    """Installed subcommands by name."""
    return {ep.name: ep for ep in sorted(entry_points(group=GROUP), key=lambda ep: ep.name)}


def source_of(module: str) -> Path | None:
    """The file of ``module``, found without importing it or its packages (a package's ``__init__`` may be
    heavy: the API's imports FastAPI)."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None:
        return None
    if not rest:
        return Path(spec.origin) if spec.origin else None
    for location in spec.submodule_search_locations or ():
        base = Path(location).joinpath(*rest)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def docstring_of(ep: EntryPoint) -> str | None:
    """The docstring of an entry point's function, else of its module, read from the source."""
    path = source_of(ep.module)
    if path is None:
        return None
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == ep.attr:
            return ast.get_docstring(node) or ast.get_docstring(tree)
    return ast.get_docstring(tree)


def describe(ep: EntryPoint) -> str:
    """One line about a command: its main's docstring, else its module's, else its package summary — read
    from the source, so that ``sundial --help`` imports none of the commands."""
    try:
        doc = docstring_of(ep)
    except (OSError, SyntaxError, ValueError, ImportError):
        doc = None
    if doc and doc.strip():
        return doc.strip().splitlines()[0].rstrip(".").replace("``", "`")
    summary = ep.dist.metadata["Summary"] if ep.dist is not None else None
    return str(summary or "")


def _usage(commands: dict[str, EntryPoint]) -> str:
    lines = [
        "usage: sundial [--version] <command> [args...]",
        "",
        "Sundial, a distributed job scheduler. `sundial <command> --help` describes a command.",
        "",
        "commands:",
    ]
    width = max((len(name) for name in commands), default=0)
    lines += [f"  {name.ljust(width)}  {describe(ep)}" for name, ep in commands.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``sundial <command> args...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    commands = discover()
    if args[:1] == ["--version"]:
        print(f"sundial {version('sundial-client')}")
        return 0
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage(commands))
        return 0 if args else 2
    name, rest = args[0], args[1:]
    ep = commands.get(name)
    if ep is None:
        hint = difflib.get_close_matches(name, commands, n=1)
        suggestion = f"; did you mean `{hint[0]}`?" if hint else ""
        print(f"sundial: unknown command `{name}`{suggestion} (see `sundial --help`)", file=sys.stderr)
        return 2
    try:
        command: CommandMain = ep.load()
    except Exception as exc:  # report a broken member as a one-line error rather than a traceback
        print(f"sundial: command `{name}` ({ep.value}) failed to load: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    result = command(rest)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
