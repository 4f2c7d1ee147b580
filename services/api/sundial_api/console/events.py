"""The console's live updates pushed as server-sent events: ``GET /ui/events``, one stream per open tab.

The stream says when the signed-in tenant's data changed, from the process's one change feed
(:mod:`sundial_api.change_feed`): each tab's stream only reads the feed's version in memory once a second, so
however many tabs are open the database still sees one query a second per process. Its events:

* ``live`` (data: the version) once the feed knows the tenant's version: the tab stops its 2-second polling of
  the regions the change feed answers and refreshes them on ``change`` instead (still re-reading them every
  :data:`~sundial_api.console.live.MAX_STALE_SEC`, for what the audit log does not record);
* ``change`` (data: the new version) when it changed;
* ``paused`` when the feed cannot say (Postgres away): the tab polls again until the next ``live``.

Polling stays the fallback: without JavaScript, without ``EventSource``, or while the stream is down, the
regions poll as before. A stream ends after :data:`STREAM_SEC` (the browser reconnects at once), when the
process stops (:func:`close_streams`), and when the session ends: it re-checks the session as every request
does, every :data:`RECHECK_SEC`. The stream is same-origin, so the Content-Security-Policy's
``connect-src 'self'`` allows it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from sundial_api.console.guard import ConsoleRoute, Signed, SignInRequired, current_session
from sundial_api.console.sessions import ConsoleSession
from sundial_api.state import ApiState, State

router = APIRouter(prefix="/ui", route_class=ConsoleRoute, include_in_schema=False)

#: How often a stream looks at the feed's version (the feed itself polls once a second).
CHECK_SEC = 1.0
#: How often a stream re-checks its session (signed out, suspended tenant, rotated key) and sends a keep-alive.
RECHECK_SEC = 15.0
#: The longest one stream lasts; the browser's EventSource reconnects by itself.
STREAM_SEC = 300.0
#: How long the browser waits before reconnecting a stream that ended (the SSE ``retry`` field, ms).
RETRY_MS = 3000


#: Set when the process stops: open streams end within :data:`CHECK_SEC`, so a graceful stop never waits on a tab.
CLOSING = threading.Event()


def close_streams() -> None:
    """End every open stream of this process (called when it stops; browsers reconnect to another replica)."""
    CLOSING.set()


def event(name: str, data: str) -> bytes:
    """One server-sent event (``data`` is a version: one line, no tenant text)."""
    return f"event: {name}\ndata: {data}\n\n".encode()


async def changes(request: Request, state: ApiState, session: ConsoleSession) -> AsyncIterator[bytes]:
    """The events of one tab's stream (see the module docstring), until it is closed, ends or the session does."""
    yield f"retry: {RETRY_MS}\n\n".encode()
    started = checked = time.monotonic()
    shown: str | None = None
    while (now := time.monotonic()) - started < STREAM_SEC:
        if CLOSING.is_set() or await request.is_disconnected():
            return
        if now - checked >= RECHECK_SEC:
            checked = now
            try:
                await current_session(request, state)
            except SignInRequired:
                yield event("ended", "session")
                return
            yield b": keep-alive\n\n"
        version = state.changes.version(session.tenant)
        if version is None and shown is not None:
            shown = None
            yield event("paused", "feed")
        elif version is not None and shown is None:
            shown = version
            yield event("live", version)
        elif version is not None and version != shown:
            shown = version
            yield event("change", version)
        await asyncio.sleep(CHECK_SEC)


@router.get("/events")
async def events(request: Request, state: State, session: Signed) -> Response:
    return StreamingResponse(
        changes(request, state, session),
        media_type="text/event-stream",
        headers={"X-Accel-Buffering": "no"},  # a proxy in front must not hold the events back
    )
