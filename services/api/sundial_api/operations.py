"""What the endpoints of long-running operations (replays, bulk operations, backfills) share: the
``Idempotency-Key`` of their create, the answer to a create, and their newest-first cursor pages.

Each operation is a durable row created by one ``POST`` (202 with ``Location``) and followed with ``GET``s; a
retried create with the same key answers with the operation the first one made (``Idempotent-Replayed: true``),
the same key with another body is refused (422), and the key is kept with the operation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated
from uuid import UUID

from fastapi import Header
from pydantic import BaseModel
from sundial_common.stores.types import Record

from sundial_api.idempotency import HEADER, invalid_key, request_hash, valid_key
from sundial_api.pagination import InvalidCursor, decode_id_cursor, encode_id_cursor
from sundial_api.problems import invalid

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
