"""What every ``sundial`` API command shares: exit codes, tables and JSON, argument helpers, and the runner.

The runner (:func:`run`) parses, resolves the connection, runs the command and turns what went wrong into a
one-line message and a documented exit code; :func:`main` also keeps a closed pipe (``sundial jobs list |
head``) from printing a traceback. The client is imported when a command runs, not when a parser is built.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sundial_client.cli.connection import AUTH, DEFAULT_URL, USAGE, UsageError, resolve_connection

if TYPE_CHECKING:
    from pydantic import BaseModel

    from sundial_client.client import Client
    from sundial_client.errors import ApiError

# Exit codes scripts can rely on (also in every --help); USAGE (2: bad command line or configuration) and AUTH
# (6: 401/403, or no token found) come from the connection module, which raises them too.
OK = 0
FAILED = 1  # an unexpected server error, or `watch` saw the execution end other than SUCCEEDED
NOT_FOUND = 3
INVALID = 4  # 400/413/422: the problem's field messages are printed
CONFLICT = 5  # 409/412: the state (or version) does not allow it
UNAVAILABLE = 7  # unreachable, or 429/503 after every retry
INTERRUPTED = 130  # Ctrl-C
CLOSED_PIPE = 141  # the reader of the output went away (`| head`), as for any command killed by SIGPIPE

EXIT_CODES = f"""\
exit codes:
  {OK}  done (`watch`: the execution SUCCEEDED)
  {FAILED}  server error, or `watch`: the execution ended otherwise (FAILED, DEAD, CANCELLED, …)
  {USAGE}  bad arguments or configuration
  {NOT_FOUND}  no such job or execution (for this tenant)
  {INVALID}  invalid input: each field at fault is printed
  {CONFLICT}  the job's or execution's state (or version) does not allow it
  {AUTH}  missing, invalid or insufficient token
  {UNAVAILABLE}  the API is unreachable or overloaded (after retries)
  {CLOSED_PIPE}  the output was closed early (`| head`)

connection: --url/--token, else SUNDIAL_URL/SUNDIAL_TOKEN, else $SUNDIAL_CONFIG or
~/.config/sundial/config.toml (url = "…", token = "…" or token_file = "…"), else the dev stack
({DEFAULT_URL}; .sundial/dev-token, or .sundial/admin-token for admin commands, in $SUNDIAL_DEV_ROOT
or the nearest .sundial/ from the current directory upwards).
"""

#: A command: what it does with the client and the parsed arguments; answers the exit code.
Command = Callable[["Client", argparse.Namespace], int]

# The API's enums as the parsers offer them: the parsers are built without importing the models (pydantic),
# so that `--help` is quick; tests/unit/test_cli.py checks these against the models.
JOB_STATES = ("ACTIVE", "PAUSED", "COMPLETED", "CANCELLED")
JOB_TYPES = ("ONE_SHOT", "DELAYED", "CRON", "INTERVAL", "RUN_LIST", "DEPENDENT")
EXECUTION_STATES = (
    "PENDING",
    "RUNNING",
    "SUCCEEDED",
    "FAILED",
    "TIMED_OUT",
    "CANCELLED",
    "FAILED_WORKER_LOST",
    "DEAD",
    "SKIPPED",
)
OVERLAP_POLICIES = ("ALLOW", "SKIP", "BUFFER_ONE", "CANCEL_RUNNING")
CATCHUP_POLICIES = ("FIRE_ONCE", "FIRE_ALL", "SKIP")
PRIORITIES = ("LOW", "NORMAL", "HIGH")
BACKOFFS = ("FIXED", "LINEAR", "EXPONENTIAL")


# --- output ---------------------------------------------------------------------------------------


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def dump(value: BaseModel | Sequence[BaseModel]) -> str:
    """The API's own JSON shape of a model, or a JSON array of several."""
    if isinstance(value, Sequence):
        return json.dumps([v.model_dump(mode="json", by_alias=True) for v in value], indent=2)
    return json.dumps(value.model_dump(mode="json", by_alias=True), indent=2)


# --- arguments ------------------------------------------------------------------------------------


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def instant(text: str, flag: str) -> datetime:
    """An RFC 3339 instant given on the command line (``Z`` or an offset; without one, the job's zone)."""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise UsageError(f"{flag} `{text}` is not an RFC 3339 instant such as 2027-01-01T09:00:00Z") from None


def optional_instant(text: str | None, flag: str) -> datetime | None:
    return None if text is None else instant(text, flag)


def connection_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection")
    group.add_argument("--url", help=f"API base URL (env SUNDIAL_URL; default {DEFAULT_URL}).")
    group.add_argument("--token", help="Bearer token (env SUNDIAL_TOKEN).")
    group.add_argument("--token-file", help="Read the bearer token from this file.")
    parser.add_argument("--json", action="store_true", help="Print JSON (the API's own shapes) instead of text.")


def top_parser(prog: str, description: str) -> tuple[argparse.ArgumentParser, Any]:
    """A command group's parser and its sub-command set."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    return parser, parser.add_subparsers(dest="command", required=True, metavar="COMMAND")


def sub(subparsers: Any, name: str, help: str, run: Command, *, admin: bool = False) -> argparse.ArgumentParser:
    """A sub-command running ``run``; ``admin``: it needs an admin token (the dev stack's admin-token)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=help, description=help, epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    connection_options(parser)
    parser.set_defaults(run=run, admin=admin)
    return parser


# --- running --------------------------------------------------------------------------------------


def exit_code(error: ApiError) -> int:
    from sundial_client.errors import (
        BadRequest,
        Conflict,
        Forbidden,
        NotFound,
        PreconditionFailed,
        RateLimited,
        Unauthorized,
        Unavailable,
    )

    if isinstance(error, NotFound):
        return NOT_FOUND
    if isinstance(error, BadRequest):
        return INVALID
    if isinstance(error, Conflict | PreconditionFailed):
        return CONFLICT
    if isinstance(error, Unauthorized | Forbidden):
        return AUTH
    if isinstance(error, RateLimited | Unavailable) and error.status in (429, 503):
        return UNAVAILABLE
    return FAILED


def run(parser: argparse.ArgumentParser, argv: list[str], client: Client | None = None) -> int:
    """Parse ``argv`` and run the command; ``client`` replaces the one built from the connection settings."""
    args = parser.parse_args(argv)
    prog = parser.prog
    # Imported once the arguments are read: `--help` and a usage error need neither httpx nor pydantic.
    from pydantic import ValidationError

    from sundial_client.errors import ApiError, ConnectionFailed

    try:
        if client is None:
            from sundial_client.client import Client

            connection = resolve_connection(args, admin=getattr(args, "admin", False))
            with Client(connection.url, token=connection.token) as own:
                return int(args.run(own, args))
        return int(args.run(client, args))
    except UsageError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exc.code
    except ValidationError as exc:  # caught before sending: a field the API would refuse anyway
        print(f"{prog}: invalid input:", file=sys.stderr)
        for error in exc.errors():
            print(f"  {'.'.join(map(str, error['loc']))}: {error['msg']}", file=sys.stderr)
        return INVALID
    except ApiError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exit_code(exc)
    except ConnectionFailed as exc:
        print(f"{prog}: cannot reach the API: {exc}", file=sys.stderr)
        return UNAVAILABLE
    except KeyboardInterrupt:
        return INTERRUPTED


def main(parser: Callable[[], argparse.ArgumentParser], argv: list[str] | None) -> int:
    """A command group's entry point: :func:`run`, and a closed pipe ends it quietly (exit 141)."""
    try:
        code = run(parser(), list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # Whatever is still buffered would fail again at exit; send it nowhere.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return CLOSED_PIPE


# --- naming jobs ----------------------------------------------------------------------------------


def job_id(client: Client, ref: str) -> str:
    """The id of the job ``ref`` names: an id as it is, else the job registered with that key, else the one job
    called so."""
    from sundial_client.errors import NotFound

    try:
        return str(uuid.UUID(ref))
    except ValueError:
        pass
    try:
        return client.jobs.by_key(ref).job_id
    except NotFound:
        pass
    found = client.jobs.named(ref)
    if not found:
        raise UsageError(f"no job has the key or the name `{ref}` (and it is not a job id)", NOT_FOUND)
    if len(found) > 1:
        ids = ", ".join(j.job_id for j in found)
        raise UsageError(f"{len(found)} jobs are called `{ref}`: name one by its id ({ids})")
    return found[0].job_id


def audit_parser(subparsers: Any, run: Command, what: str, ident: str) -> None:
    parser = sub(
        subparsers,
        "audit",
        f"Show {what}'s audit trail, oldest first: every change, who made it (the token's subject), the state "
        "before and after.",
        run,
    )
    parser.add_argument("id", metavar=ident)
    parser.add_argument(
        "--action", action="append", metavar="ACTION", help="Only this action (repeatable), e.g. --action cancel."
    )
    parser.add_argument("--limit", type=positive, default=1000, help="At most this many entries (default 1000).")
