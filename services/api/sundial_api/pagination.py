"""Keyset pagination cursors: an opaque token for "after this row" in newest-first order.

A cursor is base64url (no padding) of ``v1:<scheduled_for as epoch µs>:<execution id hex>`` — the sort
key of the last row returned. Keyset pages stay correct and cheap however deep the client goes (no
OFFSET scan) and while new executions arrive. The version prefix lets the encoding change later
without misreading old cursors.

Lists ordered by a time-ordered id alone (jobs ``j1``, executions by state or trace ``x1``) use
:func:`encode_id_cursor`: base64url of ``<prefix>:<id hex>``; the prefix keeps one list's cursor out of another.
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import UTC, datetime, timedelta
from uuid import UUID

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_BASE64URL = re.compile(r"^[A-Za-z0-9_-]{1,200}$")
_PLAIN = re.compile(r"^v1:(-?\d{1,20}):([0-9a-f]{32})$")


class InvalidCursor(ValueError):
    pass


def encode_token(plain: str) -> str:
    """base64url (no padding) of ``plain``: how every cursor of this API is made opaque."""
    return base64.urlsafe_b64encode(plain.encode()).rstrip(b"=").decode()


def decode_token(cursor: str) -> str:
    """The text an :func:`encode_token` cursor carries; :class:`InvalidCursor` if it is not one."""
    try:
        return base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidCursor("is not a cursor returned by this API") from None


def encode_cursor(scheduled_for: datetime, execution_id: UUID) -> str:
    micros = (scheduled_for - _EPOCH) // _MICROSECOND
    return encode_token(f"v1:{micros}:{execution_id.hex}")


def decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    """The (scheduled_for, id) a cursor stands for; :class:`InvalidCursor` if this API did not issue it."""
    if not _BASE64URL.match(cursor):
        raise InvalidCursor("is not a cursor returned by this API")
    plain = decode_token(cursor)
    match = _PLAIN.match(plain)
    if match is None:
        raise InvalidCursor("is not a cursor returned by this API")
    try:
        scheduled_for = _EPOCH + int(match.group(1)) * _MICROSECOND
    except OverflowError:
        raise InvalidCursor("is not a cursor returned by this API") from None
    return scheduled_for, UUID(hex=match.group(2))


_ID = re.compile(r"^[0-9a-f]{32}$")


def encode_id_cursor(prefix: str, row_id: UUID) -> str:
    """A cursor for "after the row ``row_id``" in a list ordered by its time-ordered id."""
    return encode_token(f"{prefix}:{row_id.hex}")


def decode_id_cursor(prefix: str, cursor: str) -> UUID:
    """The id an :func:`encode_id_cursor` cursor of the list ``prefix`` stands for; :class:`InvalidCursor` else."""
    plain = decode_token(cursor)
    head, _, row_id = plain.partition(":")
    if head != prefix or not _ID.match(row_id):
        raise InvalidCursor("is not a cursor returned by this API")
    return UUID(hex=row_id)
