"""``sundial tenants``: the operators' command for the tenant registry (an admin token).

``create|list|show|update|suspend|resume``. A quota option takes a number, or ``unlimited`` to clear it.
Connection, ``--json`` and exit codes as for ``sundial jobs`` (:mod:`sundial_client.cli.common`).
"""

from __future__ import annotations

import argparse
from itertools import islice
from typing import TYPE_CHECKING, Any

from sundial_client.cli.common import OK, dump, main, positive, sub, table, top_parser

if TYPE_CHECKING:
    from sundial_client.client import Client
    from sundial_client.models import Tenant

COLUMNS = ("ID", "STATE", "WEIGHT", "MAX JOBS", "CREATES/S", "CONCURRENT", "DISPATCH/S", "JITTER", "NAME")
_QUOTAS = {
    "max_active_jobs": ("maxActiveJobs", int),
    "max_creates_per_sec": ("maxCreatesPerSec", float),
    "max_concurrent_executions": ("maxConcurrentExecutions", int),
    "max_dispatch_per_sec": ("maxDispatchPerSec", float),
}


def _row(t: Tenant) -> list[Any]:
    q = t.quotas
    return [
        t.id,
        t.state,
        t.weight,
        q.max_active_jobs,
        q.max_creates_per_sec,
        q.max_concurrent_executions,
        q.max_dispatch_per_sec,
        t.default_jitter_sec,
        t.display_name,
    ]


def _print(args: argparse.Namespace, tenant: Tenant) -> None:
    print(dump(tenant) if args.json else table(COLUMNS, [_row(tenant)]))


def _quota(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float | None:
        if text.lower() == "unlimited":
            return None
        value = kind(text)
        if value <= 0 and not (kind is int and value == 0):
            raise argparse.ArgumentTypeError(f"must be positive (or `unlimited`), not {text}")
        return value

    return parse


def _fields(args: argparse.Namespace) -> dict[str, Any]:
    """The options given, as the API's fields (camelCase quotas under ``quotas``)."""
    fields: dict[str, Any] = {}
    for name in ("display_name", "weight", "default_jitter_sec"):
        if getattr(args, name) is not None:
            fields[name] = getattr(args, name)
    quotas = {wire: getattr(args, name) for name, (wire, _) in _QUOTAS.items() if getattr(args, name) is not _UNSET}
    if quotas:
        fields["quotas"] = quotas
    return fields


_UNSET: Any = object()


def create(client: Client, args: argparse.Namespace) -> int:
    _print(args, client.admin.create_tenant(args.id, **_fields(args)))
    return OK


def list_tenants(client: Client, args: argparse.Namespace) -> int:
    tenants = list(islice(client.admin.tenants(page_size=min(args.limit, 500)), args.limit))
    print(dump(tenants) if args.json else table(COLUMNS, map(_row, tenants)))
    return OK


def show(client: Client, args: argparse.Namespace) -> int:
    _print(args, client.admin.tenant(args.id))
    return OK


def update(client: Client, args: argparse.Namespace) -> int:
    _print(args, client.admin.update_tenant(args.id, **_fields(args)))
    return OK


def suspend(client: Client, args: argparse.Namespace) -> int:
    _print(args, client.admin.suspend_tenant(args.id))
    return OK


def resume(client: Client, args: argparse.Namespace) -> int:
    _print(args, client.admin.resume_tenant(args.id))
    return OK


def _registry_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", help="The tenant's name, as its tokens carry it.")
    parser.add_argument("--display-name", help="A name for people.")
    parser.add_argument("--weight", type=positive, help="Share of dispatch under contention (default 1).")
    parser.add_argument(
        "--default-jitter-sec", type=int, metavar="SECONDS", help="Jitter of CRON jobs that set none (default 0)."
    )
    quotas = parser.add_argument_group("quotas (a number, or `unlimited`)")
    quotas.add_argument("--max-active-jobs", type=_quota(int), default=_UNSET, metavar="N")
    quotas.add_argument("--max-creates-per-sec", type=_quota(float), default=_UNSET, metavar="RATE")
    quotas.add_argument("--max-concurrent-executions", type=_quota(int), default=_UNSET, metavar="N")
    quotas.add_argument("--max-dispatch-per-sec", type=_quota(float), default=_UNSET, metavar="RATE")


def parser() -> argparse.ArgumentParser:
    top, subparsers = top_parser(
        "sundial tenants",
        "Register tenants and set their weight, quotas and default cron jitter (an admin token).",
    )
    _registry_options(
        sub(subparsers, "create", "Register a tenant: its tokens are accepted from then on.", create, admin=True)
    )
    listing = sub(subparsers, "list", "List registered tenants, in id order.", list_tenants, admin=True)
    listing.add_argument("--limit", type=positive, default=100, help="At most this many (default 100).")
    sub(subparsers, "show", "Show a tenant.", show, admin=True).add_argument("id")
    _registry_options(
        sub(subparsers, "update", "Change a tenant's fields (the others keep their values).", update, admin=True)
    )
    sub(
        subparsers, "suspend", "Refuse the tenant's writes (403) and stop dispatching its jobs.", suspend, admin=True
    ).add_argument("id")
    sub(
        subparsers,
        "resume",
        "Accept a suspended tenant again; missed fires follow each job's catch-up policy.",
        resume,
        admin=True,
    )
    subparsers.choices["resume"].add_argument("id")
    return top


def tenants_main(argv: list[str] | None = None) -> int:
    """Register tenants and set their weight and quotas over the API (admin)"""
    return main(parser, argv)
