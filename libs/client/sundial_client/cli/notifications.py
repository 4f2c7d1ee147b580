"""``sundial notifications``: the tenant's webhook subscriptions — ``subscribe`` (prints the secret, once),
``list``, ``show``, ``test``, ``rotate-secret``, ``deliveries`` and ``delete``; and, for an admin, ``allow``,
``allowed`` and ``disallow`` (one tenant's destination allowed although it is not public).

Connection, ``--json`` and exit codes as for ``sundial jobs`` (:mod:`sundial_client.cli.common`).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from sundial_client.cli.common import FAILED, OK, dump, main, sub, table, top_parser

if TYPE_CHECKING:
    from sundial_client.client import Client
    from sundial_client.models.notifications import AllowedDestination, DeliveryView, SubscriptionView

#: The events a subscription may name (the server's list; an unknown one is refused there, naming `events`).
EVENTS = (
    "execution.dead",
    "execution.late",
    "execution.failing",
    "execution.recovered",
    "breaker.opened",
    "breaker.closed",
    "backfill.finished",
    "replay.finished",
    "bulk.finished",
    "pool.unserved",
    "pool.served",
)
COLUMNS = ("ID", "URL", "EVENTS", "POOL", "JOB", "SECRET")
ALLOWED_COLUMNS = ("TENANT", "DESTINATION", "ADDRESSES", "ALLOWED BY", "CREATED AT")
DELIVERY_COLUMNS = ("ID", "EVENT", "STATE", "ATTEMPTS", "LAST STATUS", "LAST ERROR", "OCCURRED AT", "EXECUTION")


def _row(s: SubscriptionView) -> list[Any]:
    where = s.url or f"mailto:{s.email}" + ("" if s.email_confirmed else " (unconfirmed)")
    return [s.id, where, ",".join(s.events), s.pool, s.job_id, s.secret]


def _print(args: argparse.Namespace, subscription: SubscriptionView) -> None:
    print(dump(subscription) if args.json else table(COLUMNS, [_row(subscription)]))


def subscribe(client: Client, args: argparse.Namespace) -> int:
    made = client.notifications.subscribe(
        args.url, args.event, email=args.email, pool=args.pool, job_id=args.job, description=args.description
    )
    _print(args, made)
    if not args.json and args.email:
        print(f"\nA confirmation link was sent to {args.email}: nothing is sent there until it is followed.")
    elif not args.json:
        print("\nThe secret is shown this once: give it to the receiver to verify signatures.")
    return OK


def list_subscriptions(client: Client, args: argparse.Namespace) -> int:
    found = client.notifications.list()
    print(dump(found) if args.json else table(COLUMNS, map(_row, found)))
    return OK


def show(client: Client, args: argparse.Namespace) -> int:
    _print(args, client.notifications.get(args.id))
    return OK


def rotate_secret(client: Client, args: argparse.Namespace) -> int:
    _print(args, client.notifications.rotate_secret(args.id, previous_valid_sec=args.previous_valid_sec))
    return OK


def test(client: Client, args: argparse.Namespace) -> int:
    sent = client.notifications.test(args.id)
    if args.json:
        print(dump(sent))
    else:
        print(f"{'delivered' if sent.delivered else 'not delivered'}: {sent.error or f'HTTP {sent.status}'}")
    return OK if sent.delivered else FAILED


def _delivery_row(d: DeliveryView) -> list[Any]:
    return [d.id, d.event, d.state, d.attempts, d.last_status, d.last_error, d.occurred_at, d.execution_id]


def deliveries(client: Client, args: argparse.Namespace) -> int:
    found = client.notifications.deliveries(args.id, limit=args.limit)
    print(dump(found) if args.json else table(DELIVERY_COLUMNS, map(_delivery_row, found)))
    return OK


def delete(client: Client, args: argparse.Namespace) -> int:
    client.notifications.delete(args.id)
    return OK


def _allowed_row(a: AllowedDestination) -> list[Any]:
    return [a.tenant, a.origin, ",".join(a.addresses), a.allowed_by, a.created_at]


def allow(client: Client, args: argparse.Namespace) -> int:
    made = client.admin.allow_destination(args.tenant, args.url)
    print(dump(made) if args.json else table(ALLOWED_COLUMNS, [_allowed_row(made)]))
    return OK


def allowed(client: Client, args: argparse.Namespace) -> int:
    found = client.admin.allowed_destinations(args.tenant)
    print(dump(found) if args.json else table(ALLOWED_COLUMNS, map(_allowed_row, found)))
    return OK


def disallow(client: Client, args: argparse.Namespace) -> int:
    client.admin.revoke_destination(args.tenant, args.url)
    return OK


def parser() -> argparse.ArgumentParser:
    top, subparsers = top_parser(
        "sundial notifications",
        "Webhooks told about incidents of the tenant's jobs, signed with Standard Webhooks (webhook-id, "
        "webhook-timestamp, webhook-signature) and retried until the receiver answers 2xx.",
    )
    made = sub(
        subparsers,
        "subscribe",
        "Subscribe a webhook (prints its signing secret, once) or, with --email, an e-mail address.",
        subscribe,
    )
    made.add_argument(
        "url", nargs="?", help="https:// URL whose host resolves to public addresses (http:// in development)."
    )
    made.add_argument(
        "--email", help="Write to this address instead (through the server's SMTP relay), once it is confirmed."
    )
    made.add_argument(
        "--event", action="append", required=True, choices=EVENTS, help="An event to be told about (repeatable)."
    )
    made.add_argument("--pool", help="Only incidents of this pool.")
    made.add_argument("--job", help="Only incidents of this job (its id).")
    made.add_argument("--description", help="A note for people reading the list.")
    sub(subparsers, "list", "List the subscriptions (secrets redacted).", list_subscriptions)
    sub(subparsers, "show", "Show a subscription.", show).add_argument("id")
    sub(
        subparsers, "test", "Send a signed `test` event now; exit 1 unless the receiver answered 2xx.", test
    ).add_argument("id")
    rotating = sub(
        subparsers,
        "rotate-secret",
        "Make a new secret (printed once); the previous one signs for a while.",
        rotate_secret,
    )
    rotating.add_argument("id")
    rotating.add_argument(
        "--previous-valid-sec",
        type=int,
        default=86_400,
        help="How long requests still carry a signature with the previous secret too (default: a day; 0: not).",
    )
    log = sub(subparsers, "deliveries", "The subscription's delivery log, newest first.", deliveries)
    log.add_argument("id")
    log.add_argument("--limit", type=int, default=50, help="At most this many (default 50, at most 500).")
    sub(subparsers, "delete", "Delete a subscription (pending deliveries are cancelled).", delete).add_argument("id")
    allowing = sub(
        subparsers,
        "allow",
        "Admin: let TENANT's subscriptions reach URL's scheme, host and port, at the addresses it resolves to now, "
        "although they are not public.",
        allow,
    )
    allowing.add_argument("tenant")
    allowing.add_argument("url")
    sub(subparsers, "allowed", "Admin: the destinations allowed, for one tenant or all.", allowed).add_argument(
        "--tenant", help="Only this tenant's."
    )
    revoking = sub(
        subparsers,
        "disallow",
        "Admin: withdraw an allowance (its subscriptions are refused from their next send).",
        disallow,
    )
    revoking.add_argument("tenant")
    revoking.add_argument("url")
    return top


def notifications_main(argv: list[str] | None = None) -> int:
    """The tenant's webhook subscriptions: subscribe, list, show, test, rotate-secret, deliveries, delete"""
    return main(parser, argv)
