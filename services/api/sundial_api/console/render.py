"""How the console turns data into HTML: one Jinja2 environment, autoescaping everything, and its filters.

Every value a tenant controls (job names, labels, payloads, errors, tracebacks) reaches the page through
``{{ … }}``, which escapes it; no template marks tenant data ``|safe``. Pages come in two sizes: the whole
page, and, for htmx's refresh of a live region (``HX-Request``), only that region's template.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse

TEMPLATES = Path(__file__).with_name("templates")
STATIC = Path(__file__).with_name("static")

#: What a redirect's ``notice`` query parameter may say: a fixed vocabulary, so no text is reflected from a URL.
NOTICES = {
    "triggered": "Triggered: the run is queued; it shows below within moments.",
    "paused": "Paused: no fires until it is resumed.",
    "resumed": "Resumed.",
    "cancelled": "Cancelled.",
    "cancel-requested": "Cancel requested: its worker has been asked to stop it.",
    "retried": "Re-driven: its next attempt is scheduled now.",
    "created": "Job created.",
    "edited": "Saved: the job is changed (see its audit trail).",
    "unchanged": "Nothing to save: the form was sent as the job already is.",
    "deleted": "Deleted: the job is CANCELLED and fires no more; its history stays readable.",
    "breaker-opened": "Breaker opened: retries of that handler are held.",
    "breaker-closed": "Breaker closed: held retries go ahead.",
    "backfill-started": "Backfill started: its occurrences run at its rate; progress below.",
    "subscription-deleted": "Subscription deleted: nothing more is sent to it.",
    "signed-out": "Signed out.",
    "session-ended": "Your session ended: sign in again.",
}


def when(value: Any, zone: str | None = None) -> str:
    """An instant as ``2026-05-05 10:00:00 UTC`` (or on the wall clock of ``zone``); empty for none."""
    if value is None or value == "":
        return "—"
    instant = value if isinstance(value, datetime) else datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if zone and zone != "UTC":
        try:
            local = instant.astimezone(ZoneInfo(zone))
        except (ZoneInfoNotFoundError, ValueError):
            local = instant.astimezone(UTC)
        return local.strftime("%Y-%m-%d %H:%M:%S %Z")
    return instant.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def seconds_between(start: Any, end: Any) -> str:
    """How long from ``start`` to ``end`` (ISO instants), as ``1.234 s``; empty if either is missing."""
    if not start or not end:
        return "—"
    a = datetime.fromisoformat(str(start).replace("Z", "+00:00"))
    b = datetime.fromisoformat(str(end).replace("Z", "+00:00"))
    return f"{(b - a).total_seconds():.3f} s"


def pretty_json(value: Any) -> str:
    """JSON indented for a <pre> block (escaped by the template like any text)."""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


environment = Environment(
    loader=FileSystemLoader(TEMPLATES),
    autoescape=select_autoescape(enabled_extensions=("html",), default=True),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
environment.filters["when"] = when
environment.filters["duration"] = seconds_between
environment.filters["pretty_json"] = pretty_json


def is_htmx(request: Request) -> bool:
    """A refresh of a live region by htmx (it sends ``HX-Request: true``)."""
    return request.headers.get("hx-request") == "true"


def page(
    request: Request,
    template: str,
    context: Mapping[str, Any],
    *,
    status_code: int = 200,
    live: str | None = None,
) -> HTMLResponse:
    """Render ``template`` (or only the ``live`` region's template, for an htmx refresh) as the response."""
    settings = request.app.state.api.settings
    notice = request.query_params.get("notice")
    values = {
        "request": request,
        "session": getattr(request.state, "console_session", None),
        "refresh_sec": settings.console_refresh_sec,
        "refresh_ms": int(settings.console_refresh_sec * 1000),
        "notice": NOTICES.get(notice or ""),
        "live_seen": getattr(request.state, "console_seen", ""),
        "live_url": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
        **context,
    }
    name = live if live is not None and is_htmx(request) else template
    return HTMLResponse(environment.get_template(name).render(values), status_code=status_code)
