"""The console's live regions: refreshed by htmx every couple of seconds, answered from the change feed.

A live region carries the version of its tenant's data it shows (``X-Console-Seen: <version>@<rendered at>``,
sent back by htmx with each refresh). When the process's change feed (:mod:`sundial_api.change_feed`) has the
same version for the tenant, the refresh is answered ``204 No Content`` without reading anything and htmx
leaves the region as it is; a changed version, no version yet, or a region older than :data:`MAX_STALE_SEC`
(what the audit log does not record, e.g. progress heartbeats) renders it afresh. A confirmation box inside a
live region carries ``hx-preserve`` and an id, so a refresh never unticks what the viewer just ticked.
"""

from __future__ import annotations

import time

from starlette.requests import Request

from sundial_api.console.render import is_htmx
from sundial_api.console.sessions import ConsoleSession
from sundial_api.state import ApiState

SEEN_HEADER = "x-console-seen"
#: The longest a live region goes without being read afresh, changed or not.
MAX_STALE_SEC = 10.0


class Unchanged(Exception):
    """Nothing the region shows has changed: answer 204 and let htmx keep it."""


def skip_unchanged(request: Request, state: ApiState, session: ConsoleSession) -> None:
    """Raise :class:`Unchanged` for a refresh whose region is current; note the version the page will show."""
    version = state.changes.version(session.tenant)
    now = time.time()
    request.state.console_seen = f"{version}@{now:.0f}" if version is not None else ""
    if version is None or not is_htmx(request):
        return
    shown, _, rendered_at = request.headers.get(SEEN_HEADER, "").partition("@")
    try:
        age = now - float(rendered_at)
    except ValueError:
        return
    if shown == version and 0 <= age < MAX_STALE_SEC:
        raise Unchanged()
