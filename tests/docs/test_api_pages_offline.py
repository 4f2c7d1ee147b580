"""``/docs`` (Swagger UI) and ``/redoc`` render with the network unplugged: every asset they load is served by the API.

The pages are built by the real app factory; no server or database is needed (the lifespan does not run).
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sundial_api.app import create_app
from sundial_infra.dev_runner import DevLayout, banner
from sundial_infra.stack import LocalStack


class _Assets(HTMLParser):
    """Every URL a page would fetch: script sources, stylesheets and icons."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "script" and values.get("src"):
            self.urls.append(values["src"] or "")
        if tag == "link" and values.get("href"):
            self.urls.append(values["href"] or "")


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app())


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_api_page_loads_only_local_assets_and_each_is_served(client: TestClient, page: str) -> None:
    response = client.get(page)
    assert response.status_code == 200
    html = response.text
    parser = _Assets()
    parser.feed(html)
    assert parser.urls, f"{page} references no asset at all"
    for url in parser.urls:
        assert url.startswith("/"), f"{page} loads {url} from another host"
        asset = client.get(url)
        assert asset.status_code == 200, f"{url} is not served"
        assert len(asset.content) > 1000 or url.endswith(".png"), f"{url} is suspiciously small"
    # Nothing else on the page names another host (fonts, a CDN in inline script).
    assert not re.search(r"https?://(?!127\.0\.0\.1)", html), f"{page} names another host"
    assert "/openapi.json" in html


def test_openapi_document_is_served_and_describes_the_jobs_api(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    assert "/v1/jobs" in document["paths"]


def test_the_run_banner_points_at_the_api_pages(tmp_path: Path) -> None:
    text = banner(DevLayout(tmp_path), LocalStack(tmp_path))
    assert "http://127.0.0.1:8080/docs" in text
