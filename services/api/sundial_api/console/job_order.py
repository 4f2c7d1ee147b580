"""The console's jobs list in next-fire order: soonest first, jobs with no next fire last.

``GET /v1/jobs`` pages newest first only; the console also offers the order an operator scans for "what runs
next". It reads the same filters (:class:`~sundial_common.stores.jobs.JobFilter`) through the job store's
``list_jobs_by_next_fire`` as the session's tenant, renders each job as ``/v1`` renders it, and pages by key on
(next fire, id), so a page never repeats or skips a job.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import orjson
from sundial_common.security.auth import Principal
from sundial_common.stores.jobs import JobFilter

from sundial_api.models.jobs import render_job
from sundial_api.pagination import InvalidCursor, decode_token, encode_token
from sundial_api.problems import invalid
from sundial_api.responses import dumps
from sundial_api.state import ApiState

_PREFIX = "n1"


def encode_cursor(next_fire_at: datetime | None, ident: UUID) -> str:
    """The cursor of "after this job" in next-fire order."""
    return encode_token(f"{_PREFIX}|{next_fire_at.isoformat() if next_fire_at else ''}|{ident.hex}")


def decode_cursor(cursor: str) -> tuple[datetime | None, UUID]:
    """The job a cursor names, by next fire and id; a 422 naming ``cursor`` if it is not one of these."""
    try:
        prefix, instant, ident = decode_token(cursor).split("|")
        if prefix != _PREFIX:
            raise ValueError(prefix)
        at = datetime.fromisoformat(instant) if instant else None
        if at is not None and at.tzinfo is None:
            raise ValueError(instant)
        return at, UUID(hex=ident)
    except (InvalidCursor, ValueError):
        raise invalid("cursor", "is not a cursor of this list (sorted by next fire)") from None


def label_filter(label: str) -> dict[str, str] | None:
    """A ``key:value`` label filter; a 422 naming ``label`` otherwise."""
    if not label:
        return None
    key, sep, value = label.partition(":")
    if not sep or not key:
        raise invalid("label", f"`{label}` is not `key:value`")
    return {key: value}


async def by_next_fire(
    state: ApiState, principal: Principal, where: JobFilter, cursor: str | None, limit: int
) -> dict[str, Any]:
    """One page of the tenant's jobs matching ``where`` in next-fire order: ``items`` and ``nextCursor``."""
    after = decode_cursor(cursor) if cursor else None
    rows = await state.stores.jobs.list_jobs_by_next_fire(principal.tenant, where, after, limit + 1)
    page = rows[:limit]
    last = page[-1] if page else None
    next_cursor = encode_cursor(last["next_fire_at"], last["id"]) if last is not None and len(rows) > limit else None
    cipher = await state.keyring.cipher(principal.tenant)
    # Through the API's serializer, so instants read exactly as on the newest-first list (RFC 3339, Z).
    return {"items": orjson.loads(dumps([render_job(row, cipher) for row in page])), "nextCursor": next_cursor}
