"""Sundial's web console, served by the API process under ``/ui``.

Server-rendered pages (Jinja2, :mod:`~sundial_api.console.render`) with htmx for the live parts, every asset
shipped in ``static/`` (no CDN, no build step). Each page reads and acts through the ``/v1`` endpoints' own
functions as the signed-in session's principal (:mod:`~sundial_api.console.answers`), so a page shows and
changes exactly what the API would for that token; sessions and their protections are
:mod:`~sundial_api.console.sessions` and :mod:`~sundial_api.console.guard`. :func:`install` mounts it all.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from sundial_api.console import (
    admin_pages,
    backfill_pages,
    bulk_pages,
    events,
    execution_pages,
    job_edit,
    job_form,
    job_pages,
    notification_pages,
    pool_pages,
    pool_target_pages,
    replay_pages,
    sign_in,
)
from sundial_api.console.render import STATIC


def install(app: FastAPI) -> None:
    """Serve the console under ``/ui`` (its assets under ``/ui/static``)."""
    app.include_router(sign_in.router)
    app.include_router(job_form.router)  # before job_pages: `/ui/jobs/new` must not match `/ui/jobs/{id}`
    app.include_router(job_edit.router)
    app.include_router(job_pages.router)
    app.include_router(execution_pages.router)
    app.include_router(pool_pages.router)
    app.include_router(pool_target_pages.router)
    app.include_router(replay_pages.router)
    app.include_router(backfill_pages.router)
    app.include_router(bulk_pages.router)
    app.include_router(notification_pages.router)
    app.include_router(admin_pages.router)
    app.include_router(events.router)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="console-static")
