"""What the commands of long operations (``sundial bulk``, ``sundial replay``) share: follow one with a live progress
line and a summary, print one as created or shown, and the sub-commands that read and stop them.

A long operation is asked for, runs in the background on the server, and is read until it has *ended*; its state is
then ``SUCCEEDED`` (exit 0) or something else (exit 1). Each command says what its progress line and summary show.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from sundial_client.cli.common import FAILED, OK, connection_options, dump, table


class Operation(Protocol):
    """What these helpers read of an operation's model."""

    @property
    def state(self) -> str: ...

    @property
    def ended(self) -> bool: ...

    def model_dump(self, *, mode: str = ..., by_alias: bool = ...) -> dict[str, Any]: ...


OperationT = TypeVar("OperationT", bound=Operation)
ModelT = TypeVar("ModelT", bound=BaseModel)

#: (the operation now, as it was at the previous poll, seconds between them) → the progress line.
Progress = Callable[[OperationT, OperationT, float], str]


def follow(
    first: OperationT,
    watch: Iterable[OperationT],
    args: argparse.Namespace,
    progress: Progress[OperationT],
    summary: Callable[[OperationT], str],
) -> int:
    """Show a live progress line (one rewritten line on a terminal, a line a poll otherwise; with ``--json`` each
    poll's operation) until the operation ends; then its summary. Exit 0 only if it SUCCEEDED."""
    tty = sys.stdout.isatty() and not args.json
    last, last_at = first, time.monotonic()
    for current in watch:
        now = time.monotonic()
        line = progress(current, last, max(now - last_at, 1e-6))
        last, last_at = current, now
        if args.json:
            print(json.dumps(current.model_dump(mode="json", by_alias=True)), flush=True)
        elif not current.ended:
            print(("\r" if tty else "") + line, end="" if tty else "\n", flush=True)
    if tty:
        print()
    if not args.json:
        print(summary(last))
    return OK if last.state == "SUCCEEDED" else FAILED


def show(
    operation: ModelT,
    args: argparse.Namespace,
    follow: Callable[[ModelT], int],
    text: Callable[[ModelT], str],
) -> int:
    """``show ID``: the operation (``--json``: whole), or with ``--wait`` followed until it ends."""
    if args.wait:
        return follow(operation)
    print(dump(operation) if args.json else text(operation))
    return OK


def print_list(
    found: Iterable[ModelT],
    args: argparse.Namespace,
    columns: Sequence[str],
    row: Callable[[ModelT], list[Any]],
) -> int:
    """``list``: the first ``--limit`` operations, a row each (``--json``: whole)."""
    shown = list(islice(found, args.limit))
    print(dump(shown) if args.json else table(columns, [row(o) for o in shown]))
    return OK


def print_brief(operation: Any, operation_id: str, args: argparse.Namespace, note: str = "") -> int:
    """One line (its id and state, and ``note``), or the whole operation with ``--json``."""
    print(dump(operation) if args.json else f"{operation_id}  {operation.state}{note}")
    return OK


def adder(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: dict[str, Any]
) -> Callable[[str, str, Callable[..., int]], argparse.ArgumentParser]:
    """``add(name, help, func)``: a sub-command with the connection options that runs ``func``."""

    def add(name: str, help: str, func: Callable[..., int]) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help, description=help, **common)
        connection_options(p)
        p.set_defaults(run=func)
        return p

    return add


def wait_options(p: argparse.ArgumentParser, help: str) -> None:
    """``--wait`` (with ``help``) and ``--interval``."""
    p.add_argument("--wait", action="store_true", help=help)
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="Progress poll interval.")
