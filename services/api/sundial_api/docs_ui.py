"""The interactive API pages, served without the internet: Swagger UI at ``/docs``, ReDoc at ``/redoc``.

FastAPI's own pages load their JavaScript and CSS from a CDN, so they are blank on a machine that cannot reach
it. Here the same pages (FastAPI's ``get_swagger_ui_html`` / ``get_redoc_html``) point at copies served by this
process under ``/docs-assets``: the files that the PyPI package ``fastapi-offline`` ships (Swagger UI's bundle
and stylesheet, ReDoc's standalone bundle, a favicon). Nothing here needs a token, like ``/openapi.json``.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

#: Where the assets are mounted.
ASSETS_PATH = "/docs-assets"
#: The directory the assets are read from: inside the installed package, so a wheel carries them.
ASSETS_DIR = Path(fastapi_offline.__file__).resolve().parent / "static"


def install(app: FastAPI, *, docs_url: str = "/docs", redoc_url: str = "/redoc") -> None:
    """Serve Swagger UI at ``docs_url`` and ReDoc at ``redoc_url`` with assets of this process only.

    The app must be built with ``docs_url=None, redoc_url=None`` so that FastAPI's CDN pages are not installed.
    """
    app.mount(ASSETS_PATH, StaticFiles(directory=ASSETS_DIR), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2_redirect_url = f"{docs_url}/oauth2-redirect"

    @app.get(docs_url, include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} — API",
            oauth2_redirect_url=oauth2_redirect_url,
            swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_PATH}/favicon.png",
        )

    @app.get(oauth2_redirect_url, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(redoc_url, include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} — API reference",
            redoc_js_url=f"{ASSETS_PATH}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS_PATH}/favicon.png",
            with_google_fonts=False,
        )
