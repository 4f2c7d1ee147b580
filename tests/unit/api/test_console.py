"""The console's pure parts: time formatting, reading the new-job form, the origin check, and the templates'
promises to the Content-Security-Policy (no inline script or style, nothing marked safe)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from starlette.requests import Request
from sundial_api.console.guard import CONTENT_SECURITY_POLICY, same_origin
from sundial_api.console.job_form import job_body
from sundial_api.console.render import STATIC, TEMPLATES, environment, seconds_between, when


def test_instants_are_shown_in_utc_or_on_the_wall_clock_of_a_zone() -> None:
    assert when("2026-03-29T01:30:00Z") == "2026-03-29 01:30:00 UTC"
    assert when("2026-03-29T01:30:00Z", "Europe/Paris") == "2026-03-29 03:30:00 CEST"  # after spring-forward
    assert when(datetime(2026, 1, 1, tzinfo=UTC), "Europe/Paris") == "2026-01-01 01:00:00 CET"
    assert when(None) == "—"
    assert when("2026-01-01T00:00:00Z", "Not/AZone") == "2026-01-01 00:00:00 UTC"
    assert seconds_between("2026-01-01T00:00:00Z", "2026-01-01T00:00:01.5Z") == "1.500 s"
    assert seconds_between(None, "2026-01-01T00:00:00Z") == "—"


def test_the_new_job_form_becomes_a_v1_job_body() -> None:
    body, errors = job_body(
        {"name": " nightly ", "type": "CRON", "schedule": "30 2 * * *", "timezone": "America/New_York",
         "pool": "demo", "handler": "echo", "payload": '{"a": [1, 2]}', "maxAttempts": "2", "intervalSec": ""}
    )  # fmt: skip
    assert errors == []
    assert body == {
        "name": "nightly",
        "type": "CRON",
        "schedule": "30 2 * * *",
        "timezone": "America/New_York",
        "target": {"pool": "demo", "handler": "echo"},
        "payload": {"a": [1, 2]},
        "retryPolicy": {"maxAttempts": 2},
    }


def test_form_fields_that_cannot_be_read_are_named() -> None:
    _, errors = job_body({"name": "x", "payload": "{", "delaySeconds": "soon", "pool": "demo", "handler": "echo"})
    assert sorted(e["field"] for e in errors) == ["delaySeconds", "payload"]


def _request(headers: dict[str, str]) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in {"host": "127.0.0.1:8080", **headers}.items()]
    return Request({"type": "http", "method": "POST", "path": "/ui/sign-out", "headers": raw, "query_string": b""})


@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ({}, True),  # an old browser sending neither header: the CSRF token still guards the form
        ({"Origin": "http://127.0.0.1:8080", "Sec-Fetch-Site": "same-origin"}, True),
        ({"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}, False),
        ({"Origin": "https://evil.example"}, False),
        ({"Origin": "null"}, False),
        ({"Sec-Fetch-Site": "same-site"}, False),
    ],
)
def test_state_changing_requests_must_come_from_this_origin(headers: dict[str, str], allowed: bool) -> None:
    assert same_origin(_request(headers)) is allowed


def test_the_policy_forbids_inline_code_and_framing() -> None:
    directives = dict(d.strip().split(" ", 1) for d in CONTENT_SECURITY_POLICY.split(";"))
    assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'" and directives["default-src"] == "'none'"


@pytest.mark.parametrize("template", sorted(p.name for p in TEMPLATES.glob("*.html")))
def test_templates_keep_to_the_policy_and_escape_everything(template: str) -> None:
    text = (TEMPLATES / template).read_text()
    assert "|safe" not in text.replace(" ", "") and "autoescape false" not in text
    assert re.search(r"\sstyle=|<style|\son[a-z]+=|javascript:", text) is None
    assert re.search(r"<script(?![^>]*\bsrc=)", text) is None  # every script is a file of the package


def test_autoescape_is_on_for_every_template() -> None:
    rendered = environment.from_string("{{ name }}").render(name="<script>x</script>")
    assert rendered == "&lt;script&gt;x&lt;/script&gt;"


def test_htmx_is_vendored_and_told_not_to_inject_its_indicator_style() -> None:
    assert (STATIC / "htmx.min.js").stat().st_size > 10_000
    assert "htmx.config.includeIndicatorStyles = false;" in (STATIC / "console.js").read_text()
    base = (TEMPLATES / "base.html").read_text()
    assert base.index("/ui/static/htmx.min.js") < base.index("/ui/static/console.js")  # set before htmx starts
    assert "http" not in re.sub(r'href="/ui/[^"]*"|src="/ui/[^"]*"', "", base).replace("http-equiv", "")
