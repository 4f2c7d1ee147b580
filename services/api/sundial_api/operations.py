"""What the endpoints of long-running operations (replays, bulk operations, backfills) share: the
``Idempotency-Key`` of their create, the answer to a create, their newest-first cursor pages, the read of one
(404 when it is not the caller's), its cancel (409 once it has finished) and the cursors of their detail pages.

Each operation is a durable row created by one ``POST`` (202 with ``Location``) and followed with ``GET``s; a
retried create with the same key answers with the operation the first one made (``Idempotent-Replayed: true``),
the same key with another body is refused (422), and the key is kept with the operation.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated
from uuid import UUID

from fastapi import Header
from pydantic import BaseModel
from sundial_common.stores.types import Record

from sundial_api.idempotency import HEADER, invalid_key, request_hash, valid_key
from sundial_api.pagination import InvalidCursor, decode_id_cursor, decode_token, encode_id_cursor
from sundial_api.problems import ProblemError, invalid, not_found, parse_resource_id

#: Reads (or changes) one operation by id, in the caller's scope: None when there is none to read (or change).
ById = Callable[[UUID], Awaitable[Record | None]]

#: The ``Idempotency-Key`` header of an operation's create.
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias=HEADER,
        description="Makes a retried create safe (per tenant, kept with the operation, 1-255 visible ASCII "
        "characters): the same key with the same body answers with the operation the first request created; "
        "with another body, 422.",
    ),
]


def checked_key(key: str | None, body: BaseModel) -> bytes | None:
    """The body's hash to keep with the key (None without a key); 422 for a key that is not one."""
    if key is None:
        return None
    if not valid_key(key):
        raise invalid_key("must be 1-255 visible ASCII characters")
    return request_hash(body)


def created_headers(location: str, row: Record, created: bool, body: BaseModel, kind: str) -> dict[str, str]:
    """``Location`` of the operation, and for a create found by its key ``Idempotent-Replayed`` — or 422 if the key
    came with another body."""
    headers = {"Location": location}
    if not created:
        if bytes(row["request_hash"]) != request_hash(body):
            raise invalid_key(f"was used for another {kind} request (a new request needs a new key)")
        headers["Idempotent-Replayed"] = "true"
    return headers


def page_start(prefix: str, cursor: str | None) -> UUID | None:
    """The id a newest-first page starts below (None: the first page); 422 naming ``cursor`` for a foreign one."""
    if cursor is None:
        return None
    try:
        return decode_id_cursor(prefix, cursor)
    except InvalidCursor as exc:
        raise invalid("cursor", str(exc)) from None


def page_of(prefix: str, rows: Sequence[Record], limit: int) -> tuple[Sequence[Record], str | None]:
    """A page of ``limit`` rows read as ``limit + 1`` (the one more tells whether another page exists) and the
    cursor of the next one."""
    page = rows[:limit]
    return page, encode_id_cursor(prefix, page[-1]["id"]) if len(rows) > limit else None


async def existing(kind: str, raw_id: str, get: ById) -> Record:
    """The operation ``raw_id`` names; 404 for a malformed id, an unknown one or another tenant's."""
    row = await get(parse_resource_id(kind, raw_id))
    if row is None:
        raise not_found(kind, raw_id)
    return row


async def cancelled(
    kind: str, raw_id: str, cancel: ById, get: ById, finished: str, *, again: str | None = None
) -> Record:
    """The operation as ``cancel`` left it; 404 as :func:`existing`, and 409 (``{kind} {id} is {state}: {finished}``)
    when there was nothing left to cancel — unless it is already in state ``again``, which answers it as it is
    (asking twice is harmless)."""
    ident = parse_resource_id(kind, raw_id)
    row = await cancel(ident)
    if row is not None:
        return row
    current = await get(ident)
    if current is None:
        raise not_found(kind, raw_id)
    if again is not None and current["state"] == again:
        return current
    raise ProblemError(409, f"{kind} {raw_id} is {current['state']}: {finished}")


def cancel_status(row: Record) -> int:
    """202 while it still runs (it stops at its next batch), 200 once it is CANCELLED."""
    return 202 if row["state"] == "RUNNING" else 200


def cursor_fields(cursor: str, pattern: re.Pattern[str]) -> tuple[int, ...]:
    """The numbers a detail page's cursor carries (``pattern``'s groups); 422 naming ``cursor`` for a foreign one."""
    try:
        plain = decode_token(cursor)
    except InvalidCursor as exc:
        raise invalid("cursor", str(exc)) from None
    match = pattern.match(plain)
    if match is None:
        raise invalid("cursor", "is not a cursor returned by this API")
    return tuple(int(g) for g in match.groups())
